// Shard export: a trainer process and an agent process see the same bytes
// at the same offsets, refuse each other when their specs differ, and hand
// versions back and forth (publish -> reads done) across real processes.
// Shards on a GPU (cuda_shards.h): the trainer's wsync.cuda_ipc/v1 file must
// name every shard of its layout with its size, and handles that cannot be
// opened (no GPU here, no exporting process) are one line, nothing opened;
// opening real handles needs a GPU and a trainer process, which
// python/tests/gpu/gpu_sync.py --trainer-sidecar runs on one.
#include "trainer_agent/shard_export.h"
#include "trainer_agent/cuda_shards.h"

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

namespace wsync::trainer_agent {
namespace {

using std::chrono::milliseconds;

TrainerParam Param(const std::string& name, Shape local, DType dtype = DType::kBF16) {
  TrainerParam p;
  p.name = name;
  p.global_shape = local;
  p.dtype = dtype;
  p.mesh = "dense";
  p.placements = {Placement::Replicate()};
  p.local_shape = local;
  p.local_offset = Shape(local.size(), 0);
  p.mesh_group = "dense";
  return p;
}

TrainerRank Rank(int32_t r) {
  TrainerRank rank;
  rank.rank = r;
  rank.host = "h";
  rank.params = {Param("a", {3, 5}), Param("b", {7}), Param("c", {0, 4}), Param("d", {2, 2}, DType::kFP32)};
  return rank;
}

std::string UniqueName(const std::string& what) {
  return "/wsync-test-" + what + "-" + std::to_string(getpid());
}

TEST(ShardLayoutTest, OffsetsAreAlignedInParamOrderAndStable) {
  StatusOr<ShardLayout> layout = ComputeShardLayout(Rank(1));
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  ASSERT_EQ(layout->slots.size(), 4u);
  EXPECT_EQ(layout->slots[0].offset, kShardHeaderBytes);
  EXPECT_EQ(layout->slots[0].bytes, 30u);
  EXPECT_EQ(layout->slots[1].offset, kShardHeaderBytes + 256);
  EXPECT_EQ(layout->slots[1].bytes, 14u);
  EXPECT_EQ(layout->slots[2].bytes, 0u);
  EXPECT_EQ(layout->slots[3].bytes, 16u);
  for (const ShardSlot& s : layout->slots) EXPECT_EQ(s.offset % kShardAlignment, 0u) << s.name;
  EXPECT_EQ(layout->Find("d"), &layout->slots[3]);
  EXPECT_EQ(layout->Find("zz"), nullptr);
  // Same spec, same hash; any change of shape, order or rank changes it.
  EXPECT_EQ(ComputeShardLayout(Rank(1))->hash, layout->hash);
  EXPECT_NE(ComputeShardLayout(Rank(2))->hash, layout->hash);
  TrainerRank other = Rank(1);
  other.params[1].local_shape = {8};
  EXPECT_NE(ComputeShardLayout(other)->hash, layout->hash);
  std::swap(other.params[0], other.params[1]);
  EXPECT_NE(ComputeShardLayout(other)->hash, layout->hash);
}

TEST(ShardLayoutTest, RegionNameFollowsTheConvention) {
  EXPECT_EQ(*ShardRegionName("job7", 3), "/wsync-job7-train-3");
  EXPECT_FALSE(ShardRegionName("a/b", 0).ok());
  EXPECT_FALSE(ShardRegionName("", 0).ok());
}

TEST(ShardExportTest, AgentSeesTrainerBytesAndRefusesAnotherSpec) {
  const std::string name = UniqueName("view");
  auto exp = ShardExport::Create(name, Rank(0));
  ASSERT_TRUE(exp.ok()) << exp.status().ToString();
  StatusOr<ShardTensor> a = (*exp)->Tensor("a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->bytes, 30u);
  std::memset(a->data, 0xab, a->bytes);
  EXPECT_EQ((*exp)->Tensor("nope").status().code(), StatusCode::kNotFound);

  auto view = ShardView::Open(name, Rank(0));
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  uint64_t bytes = 0;
  const uint8_t* p = (*view)->Shard("a", &bytes);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(bytes, 30u);
  EXPECT_EQ(p[0], 0xab);
  EXPECT_EQ(p[29], 0xab);
  EXPECT_EQ((*view)->Shard("nope", &bytes), nullptr);

  TrainerRank changed = Rank(0);
  changed.params[0].local_shape = {3, 6};
  auto bad = ShardView::Open(name, changed);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(bad.status().message().find("same TrainerRank spec"), std::string::npos) << bad.status().message();
  auto wrong_rank = ShardView::Open(name, Rank(1));
  ASSERT_FALSE(wrong_rank.ok());
  EXPECT_NE(wrong_rank.status().message().find("rank 0"), std::string::npos) << wrong_rank.status().message();
  EXPECT_FALSE(ShardView::Open(name + "-missing", Rank(0)).ok());
}

TEST(ShardExportTest, VersionsOnlyGrowAndWaitsTimeOut) {
  auto exp = ShardExport::Create(UniqueName("versions"), Rank(0));
  ASSERT_TRUE(exp.ok());
  EXPECT_FALSE((*exp)->Publish(0).ok());
  ASSERT_TRUE((*exp)->Publish(5).ok());
  EXPECT_FALSE((*exp)->Publish(5).ok());
  EXPECT_FALSE((*exp)->Publish(4).ok());
  const auto t0 = std::chrono::steady_clock::now();
  Status s = (*exp)->WaitReadsDone(5, milliseconds(50));
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(2000));
  EXPECT_NE(s.message().find("trainer-agent"), std::string::npos) << s.message();
}

// The trainer (parent) publishes three versions with distinct bytes; the
// agent (a forked child that maps the region by name) checks each version's
// bytes, then marks its reads done; the trainer overwrites only after that.
// The last version the agent marks failed: the trainer is released as well
// and can see which version failed.
TEST(ShardExportTest, PublishAndReadsDoneAcrossProcesses) {
  const std::string name = UniqueName("procs");
  auto exp = ShardExport::Create(name, Rank(0));
  ASSERT_TRUE(exp.ok());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto view = ShardView::Open(name, Rank(0));
    if (!view.ok()) _exit(10);
    uint64_t seen = 0;
    for (int i = 0; i < 3; ++i) {
      StatusOr<uint64_t> v = (*view)->WaitPublished(seen, milliseconds(10000));
      if (!v.ok() || *v != seen + 1) _exit(11);
      seen = *v;
      uint64_t bytes = 0;
      const uint8_t* a = (*view)->Shard("a", &bytes);
      const uint8_t* b = (*view)->Shard("b", &bytes);
      for (int k = 0; k < 30; ++k) {
        if (a[k] != static_cast<uint8_t>(seen * 3)) _exit(12);
      }
      for (int k = 0; k < 14; ++k) {
        if (b[k] != static_cast<uint8_t>(seen * 7)) _exit(13);
      }
      std::this_thread::sleep_for(milliseconds(20));  // the trainer must wait for this
      if (seen < 3) {
        (*view)->MarkReadsDone(seen);
      } else {
        (*view)->MarkFailed(seen);
      }
    }
    _exit(0);
  }
  for (uint64_t v = 1; v <= 3; ++v) {
    std::memset((*exp)->Tensor("a")->data, static_cast<int>(v * 3), 30);
    std::memset((*exp)->Tensor("b")->data, static_cast<int>(v * 7), 14);
    ASSERT_TRUE((*exp)->Publish(v).ok());
    Status s = (*exp)->WaitReadsDone(v, milliseconds(10000));
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ((*exp)->reads_done_version(), v);
  }
  EXPECT_EQ((*exp)->failed_version(), 3u);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace wsync::trainer_agent

namespace wsync::trainer_agent {
namespace {

// Shards on a GPU (placement kCudaIpc): the region is the header alone, and
// an agent started for the other placement is refused saying which flag.
TEST(ShardExportTest, AGpuExportIsTheHeaderAloneAndNamesTheAgentsFlag) {
  const std::string name = UniqueName("ipc-placement");
  StatusOr<std::unique_ptr<ShardExport>> gpu = ShardExport::Create(name, Rank(0), ShardPlacement::kCudaIpc);
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  EXPECT_EQ((*gpu)->layout().total_bytes, kShardHeaderBytes);
  StatusOr<ShardTensor> slot = (*gpu)->Tensor("a");
  ASSERT_FALSE(slot.ok());
  EXPECT_NE(slot.status().message().find("by CUDA IPC"), std::string::npos) << slot.status().ToString();

  StatusOr<std::unique_ptr<ShardView>> host_agent = ShardView::Open(name, Rank(0));
  ASSERT_FALSE(host_agent.ok());
  EXPECT_NE(host_agent.status().message().find("start the agent with --cuda-ipc"), std::string::npos)
      << host_agent.status().ToString();

  StatusOr<std::unique_ptr<ShardView>> gpu_agent = ShardView::Open(name, Rank(0), ShardPlacement::kCudaIpc);
  ASSERT_TRUE(gpu_agent.ok()) << gpu_agent.status().ToString();
  uint64_t bytes = 1;
  EXPECT_EQ((*gpu_agent)->Shard("a", &bytes), nullptr);  // its bytes are on the GPU, not here
  ASSERT_TRUE((*gpu)->Publish(1).ok());
  StatusOr<uint64_t> published = (*gpu_agent)->WaitPublished(0, milliseconds(1000));
  ASSERT_TRUE(published.ok()) << published.status().ToString();
  EXPECT_EQ(*published, 1u);
  (*gpu_agent)->MarkReadsDone(1);
  EXPECT_TRUE((*gpu)->WaitReadsDone(1, milliseconds(1000)).ok());

  const std::string host_name = UniqueName("host-placement");
  StatusOr<std::unique_ptr<ShardExport>> host = ShardExport::Create(host_name, Rank(0));
  ASSERT_TRUE(host.ok());
  StatusOr<std::unique_ptr<ShardView>> wrong = ShardView::Open(host_name, Rank(0), ShardPlacement::kCudaIpc);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("without --cuda-ipc"), std::string::npos) << wrong.status().ToString();
}

class CudaIpcShardsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rank_.rank = 2;
    rank_.host = "h";
    rank_.params = {Param("w.a", {4, 8}), Param("w.b", {16})};
    layout_ = ComputeShardLayout(rank_, ShardPlacement::kCudaIpc).value();
    name_ = UniqueName("cuda-shards");
    exported_ = ShardExport::Create(name_, rank_, ShardPlacement::kCudaIpc).value();
    view_ = ShardView::Open(name_, rank_, ShardPlacement::kCudaIpc).value();
  }
  static nlohmann::json Region(const std::string& id, uint64_t bytes) {
    return {{"id", id}, {"device", 0}, {"handle", std::string(128, 'b')}, {"offset", 512}, {"bytes", bytes}};
  }
  std::string Write(const nlohmann::json& doc) {
    const std::string path = ::testing::TempDir() + "shards-" + std::to_string(getpid()) + ".json";
    std::ofstream(path) << doc.dump();
    return path;
  }
  std::string OpenError(const nlohmann::json& doc) {
    StatusOr<std::unique_ptr<CudaIpcShards>> s = CudaIpcShards::Open(Write(doc), layout_, view_.get());
    EXPECT_FALSE(s.ok());
    const std::string m = s.status().message();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    return m;
  }

  TrainerRank rank_;
  ShardLayout layout_;
  std::string name_;
  std::unique_ptr<ShardExport> exported_;
  std::unique_ptr<ShardView> view_;
};

TEST_F(CudaIpcShardsTest, EveryShardMustBeThereWithItsSize) {
  const nlohmann::json missing = {{"schema", "wsync.cuda_ipc/v1"}, {"pid", 9}, {"regions", {Region("w.a", 64)}}};
  EXPECT_NE(OpenError(missing).find("trainer rank 2's region 'w.b' is not exported"), std::string::npos);
  const nlohmann::json resized = {
      {"schema", "wsync.cuda_ipc/v1"}, {"pid", 9}, {"regions", {Region("w.a", 64), Region("w.b", 30)}}};
  EXPECT_NE(OpenError(resized).find("region 'w.b' is 30 bytes, the layout says 32"), std::string::npos);
  const nlohmann::json extra = {{"schema", "wsync.cuda_ipc/v1"},
                                {"pid", 9},
                                {"regions", {Region("w.a", 64), Region("w.b", 32), Region("w.c", 8)}}};
  EXPECT_NE(OpenError(extra).find("region 'w.c' is not in trainer rank 2's layout"), std::string::npos);
}

TEST_F(CudaIpcShardsTest, HandlesThatCannotBeOpenedAreOneLine) {
  const nlohmann::json ok = {
      {"schema", "wsync.cuda_ipc/v1"}, {"pid", 9}, {"regions", {Region("w.a", 64), Region("w.b", 32)}}};
  const std::string m = OpenError(ok);
  EXPECT_TRUE(m.find("CUDA IPC region 'w.a' of process 9") != std::string::npos ||
              m.find("built without the CUDA toolkit") != std::string::npos)
      << m;
}

}  // namespace
}  // namespace wsync::trainer_agent
