// The sidecar's CUDA IPC export file (inference_agent/cuda_ipc.h): what an
// engine's file must say, and one clear error where it does not. Opening
// real handles needs a GPU and an exporting process: python/tests/gpu/
// gpu_sync.py --sidecar runs that on one.
#include "inference_agent/cuda_ipc.h"

#include <unistd.h>

#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace wsync::inference {
namespace {

InferenceRank TwoRegionRank() {
  InferenceRank r;
  r.rank = 3;
  r.regions = {{"model.a.weight", 4096, ""}, {"model.b.weight", 8192, ""}};
  return r;
}

nlohmann::json Region(const std::string& id, uint64_t bytes, uint64_t offset, char digit = 'a') {
  return {{"id", id}, {"device", 0}, {"handle", std::string(128, digit)}, {"offset", offset}, {"bytes", bytes}};
}

class CudaIpcExportTest : public ::testing::Test {
 protected:
  std::string Write(const nlohmann::json& doc) {
    std::ofstream(path_) << doc.dump();
    return path_;
  }
  void TearDown() override { unlink(path_.c_str()); }
  nlohmann::json Valid() {
    // Both tensors in one allocation: one handle, two offsets.
    return {{"schema", "wsync.cuda_ipc/v1"}, {"pid", 77},
            {"regions", {Region("model.b.weight", 8192, 4096), Region("model.a.weight", 4096, 0)}}};
  }
  nlohmann::json WithBusId() {
    nlohmann::json doc = Valid();
    doc["regions"][0]["pci_bus_id"] = "0000:18:00.0";
    return doc;
  }
  std::string Error(const nlohmann::json& doc) {
    StatusOr<cuda_ipc::Export> r = ReadCudaIpcExport(Write(doc), TwoRegionRank());
    return r.ok() ? "OK" : r.status().message();
  }
  std::string path_ = "/tmp/wsync-cuda-ipc-test-" + std::to_string(getpid()) + ".json";
};

TEST_F(CudaIpcExportTest, RegionsComeInTheLayoutsOrderWithTheirHandleBytes) {
  StatusOr<cuda_ipc::Export> r = ReadCudaIpcExport(Write(Valid()), TwoRegionRank());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->pid, 77);
  ASSERT_EQ(r->regions.size(), 2u);
  EXPECT_EQ(r->regions[0].id, "model.a.weight");
  EXPECT_EQ(r->regions[0].offset, 0u);
  EXPECT_EQ(r->regions[1].id, "model.b.weight");
  EXPECT_EQ(r->regions[1].offset, 4096u);
  EXPECT_EQ(r->regions[1].handle[0], 0xAA);
  EXPECT_EQ(r->regions[1].handle[63], 0xAA);
  EXPECT_EQ(r->regions[1].pci_bus_id, "");
  StatusOr<cuda_ipc::Export> bus = ReadCudaIpcExport(Write(WithBusId()), TwoRegionRank());
  ASSERT_TRUE(bus.ok()) << bus.status().ToString();
  EXPECT_EQ(bus->regions[1].pci_bus_id, "0000:18:00.0");  // model.b.weight, first in the file
}

TEST_F(CudaIpcExportTest, EveryMismatchIsOneLineNamingTheRegion) {
  nlohmann::json missing = Valid();
  missing["regions"].erase(0);
  EXPECT_NE(Error(missing).find("region 'model.b.weight' is not exported"), std::string::npos) << Error(missing);

  nlohmann::json size = Valid();
  size["regions"][1]["bytes"] = 4097;
  EXPECT_NE(Error(size).find("region 'model.a.weight' is 4097 bytes, the layout says 4096"), std::string::npos)
      << Error(size);

  nlohmann::json extra = Valid();
  extra["regions"].push_back(Region("model.c.weight", 16, 0));
  EXPECT_NE(Error(extra).find("region 'model.c.weight' is not in inference rank 3's layout"), std::string::npos)
      << Error(extra);

  nlohmann::json short_handle = Valid();
  short_handle["regions"][0]["handle"] = "abcd";
  EXPECT_NE(Error(short_handle).find("'handle' must be 128 hex digits"), std::string::npos) << Error(short_handle);

  nlohmann::json not_hex = Valid();
  not_hex["regions"][0]["handle"] = std::string(128, 'g');
  EXPECT_NE(Error(not_hex).find("region 'model.b.weight': 'handle' is not hex"), std::string::npos) << Error(not_hex);

  nlohmann::json twice = Valid();
  twice["regions"].push_back(Region("model.a.weight", 4096, 0));
  EXPECT_NE(Error(twice).find("given twice"), std::string::npos) << Error(twice);

  nlohmann::json negative = Valid();
  negative["regions"][0]["offset"] = -1;
  EXPECT_NE(Error(negative).find("'offset' must be a non-negative integer"), std::string::npos) << Error(negative);

  EXPECT_NE(Error({{"schema", "wsync.inference/v1"}}).find("not a wsync.cuda_ipc/v1 document"), std::string::npos);
}

// Handles no process exported (or no GPU here, or a build without CUDA):
// refused in one line, nothing registered.
TEST_F(CudaIpcExportTest, HandlesThatCannotBeOpenedAreRefusedInOneLine) {
  StatusOr<cuda_ipc::Export> ipc = ReadCudaIpcExport(Write(Valid()), TwoRegionRank());
  ASSERT_TRUE(ipc.ok()) << ipc.status().ToString();
  InferenceRank rank = TwoRegionRank();
  rank.tensors.clear();
  StatusOr<WeightStore> store = WeightStore::Create("/wsync-test-ipc-" + std::to_string(getpid()), rank);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  StatusOr<std::unique_ptr<WeightMemory>> opened = OpenCudaIpcWeights(*ipc, std::move(store).value());
  ASSERT_FALSE(opened.ok());
  const std::string m = opened.status().message();
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  EXPECT_TRUE(m.find("CUDA IPC region 'model.a.weight' of process 77") != std::string::npos ||
              m.find("built without the CUDA toolkit") != std::string::npos)
      << m;
}

}  // namespace
}  // namespace wsync::inference
