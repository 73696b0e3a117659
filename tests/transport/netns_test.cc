// tcp;ofi_rxm between two network namespaces joined by a veth pair, so the
// bytes really cross a network stack between two hosts' worth of isolation.
// Needs root and iproute2; creates and deletes its own namespaces.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "tests/transport/peer_files.h"
#include "tests/transport/peer_process.h"

namespace wsync::transport::testing {
namespace {

int Sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); }

// First line a command prints ("" if it fails).
std::string Output(const std::string& cmd) {
  std::string out;
  if (FILE* f = popen((cmd + " 2>/dev/null").c_str(), "r")) {
    char buf[256];
    if (fgets(buf, sizeof(buf), f) != nullptr) out = buf;
    pclose(f);
  }
  return out;
}

// Two namespaces a/b, veth between them, 198.18.0.1/30 and .2/30. Deleted
// in the destructor (a namespace's deletion takes its veth end with it).
class NetnsPair {
 public:
  NetnsPair() {
    const std::string id = std::to_string(getpid());
    a_ = "wsync-t-" + id + "-a";
    b_ = "wsync-t-" + id + "-b";
    const std::string va = "wsa" + id, vb = "wsb" + id;  // <= 15 chars
    ok_ = Sh("ip netns add " + a_) == 0 && Sh("ip netns add " + b_) == 0 &&
          Sh("ip link add " + va + " type veth peer name " + vb) == 0 &&
          Sh("ip link set " + va + " netns " + a_) == 0 && Sh("ip link set " + vb + " netns " + b_) == 0 &&
          Sh("ip -n " + a_ + " addr add 198.18.0.1/30 dev " + va) == 0 &&
          Sh("ip -n " + b_ + " addr add 198.18.0.2/30 dev " + vb) == 0 &&
          Sh("ip -n " + a_ + " link set " + va + " up") == 0 && Sh("ip -n " + b_ + " link set " + vb + " up") == 0 &&
          Sh("ip -n " + a_ + " link set lo up") == 0 && Sh("ip -n " + b_ + " link set lo up") == 0;
    veth_ = va;
  }
  ~NetnsPair() {
    Sh("ip netns del " + a_);
    Sh("ip netns del " + b_);
    Sh("ip link del " + veth_);  // only if it never moved into a namespace
  }
  bool ok() const { return ok_; }
  const std::string& a() const { return a_; }
  const std::string& b() const { return b_; }
  const std::string& veth_a() const { return veth_; }

 private:
  std::string a_, b_, veth_;
  bool ok_ = false;
};

TEST(NetnsTest, TcpWriteCrossesVethBetweenNamespaces) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to create network namespaces";
  if (Sh("command -v ip") != 0) GTEST_SKIP() << "iproute2 `ip` not installed";
  NetnsPair netns;
  if (!netns.ok()) GTEST_SKIP() << "could not create namespaces/veth here (no CAP_NET_ADMIN in this container?)";

  char tmpl[] = "/tmp/wsync-netns-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  constexpr uint64_t kBytes = (4 << 20) + 777;
  constexpr uint64_t kSeed = 99;
  const std::string common = "provider=tcp;ofi_rxm nics=1 timeout_ms=20000 dir=" + dir;
  auto args = [&](const std::string& ns, const std::string& rest) {
    std::vector<std::string> argv = {"ip", "netns", "exec", ns, TRANSPORT_PEER_PATH};
    std::string all = common + " " + rest, word;
    for (char c : all + " ") {
      if (c == ' ') {
        if (!word.empty()) argv.push_back(word);
        word.clear();
      } else {
        word += c;
      }
    }
    return argv;
  };
  {
    PeerProcess target(args(netns.b(), "name=t node=198.18.0.2 imm=4 count=1 linger=1 bytes=" + std::to_string(kBytes)));
    PeerProcess sender(args(netns.a(), "name=s node=198.18.0.1 send_imm=4 seed=" + std::to_string(kSeed) +
                                           " bytes=" + std::to_string(kBytes) + " send_to=" + dir + "/t.desc"));
    EXPECT_EQ(sender.Wait(std::chrono::seconds(60)), 0) << ReadFile(dir + "/s.result").value_or("no result");
    auto result = WaitForFile(dir + "/t.result", std::chrono::seconds(30));
    ASSERT_TRUE(result.has_value());
    EXPECT_EQ(*result, "ok");
    std::vector<uint8_t> expected = RandomBytes(kSeed, kBytes);
    EXPECT_TRUE(ReadFile(dir + "/t.bin").value_or("") == std::string(expected.begin(), expected.end()))
        << "bytes that crossed the veth differ from the payload";
    // The payload really went over the veth (not some other path).
    const std::string tx = Output("ip netns exec " + netns.a() + " cat /sys/class/net/" + netns.veth_a() +
                                  "/statistics/tx_bytes");
    EXPECT_GE(std::strtoull(tx.c_str(), nullptr, 10), kBytes) << "veth tx_bytes: " << tx;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace wsync::transport::testing
