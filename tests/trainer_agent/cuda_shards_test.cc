// The GPU sidecar's shards (trainer_agent/cuda_shards.h): the trainer's
// wsync.cuda_ipc/v1 file must name every shard of its layout with its size;
// handles that cannot be opened (no GPU here, no exporting process) are one
// line, nothing opened. Opening real handles needs a GPU and a trainer
// process: python/tests/gpu/gpu_sync.py --trainer-sidecar runs that on one.
#include "trainer_agent/cuda_shards.h"

#include <unistd.h>

#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace wsync::trainer_agent {
namespace {

TrainerParam Param(const std::string& name, Shape local) {
  TrainerParam p;
  p.name = name;
  p.global_shape = local;
  p.dtype = DType::kBF16;
  p.mesh = "dense";
  p.placements = {Placement::Replicate()};
  p.local_shape = local;
  p.local_offset = Shape(local.size(), 0);
  p.mesh_group = "dense";
  return p;
}

class CudaIpcShardsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rank_.rank = 2;
    rank_.host = "h";
    rank_.params = {Param("w.a", {4, 8}), Param("w.b", {16})};
    layout_ = ComputeShardLayout(rank_, ShardPlacement::kCudaIpc).value();
    name_ = "/wsync-test-cuda-shards-" + std::to_string(getpid());
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
