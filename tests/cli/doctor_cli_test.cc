// Runs the real `wsync doctor` and checks what a user reads: what works on
// this machine (shm and tcp engines open, as every other test here needs),
// a requirement that cannot work failing with its fix and exit status 1,
// RDMA NICs and their NUMA nodes read from sysfs, and the job secret
// checked as the controller loads it.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/cli/run_wsync.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class DoctorCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("wsync_doctor_cli_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The finding named `check` of a --format json run.
  static json Finding(const json& report, const std::string& check) {
    for (const json& f : report["findings"])
      if (f["check"] == check) return f;
    return nullptr;
  }

  fs::path dir_;
};

TEST_F(DoctorCliTest, SaysWhatWorksHereAndAsksForNothingMissing) {
  RunResult r = RunWsync("doctor --no-python --format json", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const json report = json::parse(r.out);
  EXPECT_TRUE(report["ok"].get<bool>());
  for (const char* provider : {"libfabric shm", "libfabric tcp;ofi_rxm"}) {
    const json f = Finding(report, provider);
    ASSERT_FALSE(f.is_null()) << provider;
    EXPECT_EQ(f["verdict"], " ok ") << f.dump();
    EXPECT_NE(f["detail"].get<std::string>().find("libfabric "), std::string::npos) << f.dump();
  }
}

TEST_F(DoctorCliTest, AProviderThatCannotWorkFailsWithItsFix) {
  RunResult r = RunWsync("doctor --no-python --provider no-such-provider", dir_);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("[FAIL] libfabric no-such-provider: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fix: the provider you asked for must work"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cannot work here"), std::string::npos) << r.out;
}

TEST_F(DoctorCliTest, ReadsRdmaNicsAndTheirNumaNodesFromSysfs) {
  const fs::path sys = dir_ / "sys";
  const fs::path nic = sys / "class/infiniband/rdmap0s6";
  fs::create_directories(nic / "ports/1");
  fs::create_directories(sys / "bus/pci/drivers/efa");
  fs::create_directories(nic / "device");
  fs::create_symlink(sys / "bus/pci/drivers/efa", nic / "device/driver");
  std::ofstream(nic / "device/numa_node") << "1\n";
  std::ofstream(nic / "ports/1/state") << "4: ACTIVE\n";
  std::ofstream(nic / "ports/1/rate") << "100 Gb/sec (4X EDR)\n";
  RunResult r = RunWsync("doctor --no-python --format json --sysfs " + sys.string(), dir_);
  const json f = Finding(json::parse(r.out), "RDMA NICs");
  EXPECT_EQ(f["verdict"], " ok ") << r.out;
  EXPECT_EQ(f["detail"], "rdmap0s6 (efa, 4: ACTIVE, 100 Gb/sec (4X EDR), NUMA node 1)") << r.out;

  // None at all: said, and a failure only when a NIC provider is asked for.
  fs::remove_all(sys / "class/infiniband");
  r = RunWsync("doctor --no-python --format json --sysfs " + sys.string(), dir_);
  EXPECT_EQ(Finding(json::parse(r.out), "RDMA NICs")["verdict"], " -- ") << r.out;
}

TEST_F(DoctorCliTest, ChecksTheJobSecretAsTheControllerLoadsIt) {
  const fs::path secret = dir_ / "job.secret";
  ASSERT_EQ(RunWsync("secret " + secret.string(), dir_).exit_code, 0);
  RunResult r = RunWsync("doctor --no-python --secret-file " + secret.string(), dir_);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("[ ok ] job secret: secret file " + secret.string()), std::string::npos) << r.out;

  fs::permissions(secret, fs::perms::group_read | fs::perms::others_read, fs::perm_options::add);
  r = RunWsync("doctor --no-python --secret-file " + secret.string(), dir_);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("[FAIL] job secret: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("chmod 600"), std::string::npos) << r.out;
}

}  // namespace
