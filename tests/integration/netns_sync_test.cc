// Trainer ranks in one network namespace, inference ranks in another, the
// controller on the switch between them: one update over tcp;ofi_rxm crosses
// real veth links and every inference byte matches the reference.
// Needs root and iproute2; skips (saying why) only where no namespace can be
// made at all: a cluster that fails to build where they can is a failure.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "demo/local_sync.h"
#include "demo/netns_cluster.h"

namespace wsync::demo {
namespace {

TEST(NetnsSyncTest, UpdateCrossesNamespacesAndVerifiesBitForBit) {
  StatusOr<std::unique_ptr<EmulatedCluster>> cluster = EmulatedCluster::Create({.hosts = 2, .rate_gbit = 0});
  if (!cluster.ok() && cluster.status().code() == StatusCode::kUnavailable) {
    GTEST_SKIP() << cluster.status().message();
  }
  ASSERT_TRUE(cluster.ok()) << cluster.status().message();
  EmulatedCluster& c = **cluster;
  const HostPlacement trainers{c.host_netns(0), c.host_address(0)};
  const HostPlacement inference{c.host_netns(1), c.host_address(1)};

  LocalSyncOptions o;
  o.cluster = std::string(WSYNC_SOURCE_DIR) + "/examples/tiny-moe-4x2/cluster.json";
  o.binary = WSYNC_BINARY;
  o.provider = "tcp;ofi_rxm";
  o.job = "netns" + std::to_string(getpid());
  o.work_dir = "/tmp/wsync-" + o.job;
  o.version_timeout_s = 60;
  o.trainers.assign(4, trainers);
  o.inference.assign(2, inference);
  o.controller = {c.switch_netns(), c.switch_address()};
  const uint64_t tx_before = c.HostTxBytes(0);
  {
    StatusOr<std::unique_ptr<LocalSync>> sync = LocalSync::Start(o);
    ASSERT_TRUE(sync.ok()) << sync.status().message();
    StatusOr<UpdateReport> r = (*sync)->Update(1);
    ASSERT_TRUE(r.ok()) << r.status().message();
    ASSERT_EQ(r->state, "complete") << r->failure;
    Status v = (*sync)->Verify(1, &*r);
    EXPECT_TRUE(v.ok()) << v.message();
    EXPECT_GT(r->verified_tensors, 0u);
    // The weights really left the trainers' namespace over its veth.
    EXPECT_GE(c.HostTxBytes(0) - tx_before, r->wire_bytes) << "trainer host eth0 tx bytes";
  }
  std::filesystem::remove_all(o.work_dir);
}

}  // namespace
}  // namespace wsync::demo
