// `wsync controller` as a real process: first stdout line is the address,
// SIGTERM stops it cleanly, and a second process on the same state dir
// serves the same plan.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include "controller_fixture.h"

extern char** environ;

namespace wsync::controller::testing {
namespace {

struct Process {
  pid_t pid = -1;
  std::string first_line;
};

// Starts `wsync controller ...` and reads its first stdout line.
Process StartControllerProcess(const std::vector<std::string>& args) {
  Process p;
  int out[2];
  if (::pipe(out) != 0) return p;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  std::vector<std::string> all = {WSYNC_BINARY, "controller"};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int rc = posix_spawn(&p.pid, WSYNC_BINARY, &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  if (rc != 0) {
    p.pid = -1;
    ::close(out[0]);
    return p;
  }
  FILE* f = ::fdopen(out[0], "r");
  char buf[256] = {0};
  if (std::fgets(buf, sizeof(buf), f)) p.first_line = buf;
  std::fclose(f);
  while (!p.first_line.empty() && p.first_line.back() == '\n') p.first_line.pop_back();
  return p;
}

int StopProcess(pid_t pid) {
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST_F(ControllerTest, CommandPrintsItsAddressAndRestartsOnItsStateDir) {
  if (::access(WSYNC_BINARY, X_OK) != 0) GTEST_SKIP() << WSYNC_BINARY << " not built";
  const std::vector<std::string> args = {"--listen", "127.0.0.1:0", "--state-dir", state_dir_.string(),
                                         "--trainers", "2", "--inference", "2",
                                         "--mapping", DataPath("mapping.json")};
  Process first = StartControllerProcess(args);
  ASSERT_GT(first.pid, 0);
  StatusOr<ControllerClient> client = ControllerClient::FromAddress(first.first_line);
  ASSERT_TRUE(client.ok()) << "first stdout line: '" << first.first_line << "'";
  EXPECT_TRUE(client->Healthy());
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(client->RegisterTrainerJson(world_.TrainerBody(r)).ok());
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(client->RegisterInferenceJson(world_.InferenceBody(r)).ok());
  StatusOr<json> before = client->GetStatus();
  ASSERT_TRUE(before.ok());
  ASSERT_EQ((*before)["phase"], "planned");
  EXPECT_EQ(StopProcess(first.pid), 0);

  Process second = StartControllerProcess(args);
  ASSERT_GT(second.pid, 0);
  StatusOr<ControllerClient> again = ControllerClient::FromAddress(second.first_line);
  ASSERT_TRUE(again.ok()) << "first stdout line: '" << second.first_line << "'";
  StatusOr<json> after = again->GetStatus();
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_EQ((*after)["phase"], "planned");
  EXPECT_EQ((*after)["plan"]["plan_id"], (*before)["plan"]["plan_id"]);
  EXPECT_EQ(StopProcess(second.pid), 0);
}

TEST_F(ControllerTest, CommandRefusesABadAddressInOneLine) {
  if (::access(WSYNC_BINARY, X_OK) != 0) GTEST_SKIP() << WSYNC_BINARY << " not built";
  const std::string cmd = std::string(WSYNC_BINARY) + " controller --listen nonsense --state-dir " +
                          state_dir_.string() + " --trainers 1 --inference 1 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), p)) out += buf;
  const int status = ::pclose(p);
  EXPECT_NE(WEXITSTATUS(status), 0);
  EXPECT_NE(out.find("'nonsense' is not HOST:PORT"), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
}

}  // namespace
}  // namespace wsync::controller::testing
