// What an engine says it can do matches what it then does: an engine that
// reports no CUDA memory refuses a CUDA registration with one line that
// says why, before any write is tried.
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "transport/libfabric/fabric_info.h"
#include "transport/libfabric/libfabric_engine.h"

namespace wsync::transport {
namespace {

TEST(CapabilitiesTest, HostEngineNamesItsLibraryAndNoCudaMemory) {
  fabric::LibfabricOptions o;
  o.provider = "shm";
  auto engine = fabric::CreateLibfabricEngine(o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  const Capabilities& caps = (*engine)->capabilities();
  EXPECT_EQ(caps.library.rfind("libfabric ", 0), 0u) << caps.library;
  EXPECT_FALSE(caps.cuda_memory);
  EXPECT_TRUE(caps.remote_cq_data);
  EXPECT_NE((*engine)->Describe().find("CUDA memory no"), std::string::npos) << (*engine)->Describe();
}

TEST(CapabilitiesTest, CudaMemoryIsRefusedClearlyWhenTheEngineSaysItCannot) {
  fabric::LibfabricOptions o;
  o.provider = "shm";
  o.enable_hmem = true;
  auto engine = fabric::CreateLibfabricEngine(o);
  if (!engine.ok()) {
    // This libfabric's shm offers no FI_HMEM at all: said at start, clearly.
    EXPECT_NE(engine.status().message().find("FI_HMEM"), std::string::npos) << engine.status().ToString();
    return;
  }
  std::vector<char> buffer(1 << 16);
  auto region = (*engine)->Register(buffer.data(), buffer.size(), MemoryKind::kCuda, 0);
  if ((*engine)->capabilities().cuda_memory) {
    GTEST_SKIP() << "this libfabric can register CUDA memory: " << (*engine)->Describe();
  }
  ASSERT_FALSE(region.ok()) << "an engine that reports no CUDA memory registered some";
  EXPECT_NE(region.status().message().find("without CUDA support"), std::string::npos) << region.status().ToString();
}

// GPU memory with host staging as the fallback: a provider without FI_HMEM
// (tcp here, checked against fi_getinfo by the first engine's failure)
// still gives a working engine, for host memory, and says why not CUDA.
TEST(CapabilitiesTest, AProviderWithoutHmemGivesAHostEngineAndSaysWhy) {
  fabric::LibfabricOptions o;
  o.provider = "tcp;ofi_rxm";
  o.node = "127.0.0.1";
  auto gpu = fabric::CreateLibfabricEngineForGpu(o, fabric::GpuMemory::kDirectOrHost);
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  ASSERT_NE(gpu->engine, nullptr);
  if (gpu->cuda_memory) GTEST_SKIP() << "this libfabric's tcp can register CUDA memory: " << gpu->engine->Describe();
  EXPECT_FALSE(gpu->engine->capabilities().cuda_memory);
  EXPECT_FALSE(gpu->why_not.empty());
  std::vector<char> buffer(1 << 16);
  auto region = gpu->engine->Register(buffer.data(), buffer.size());
  EXPECT_TRUE(region.ok()) << region.status().ToString();
  region.value().reset();
  gpu->engine.reset();
  // Without the fallback, one line that says why.
  auto direct = fabric::CreateLibfabricEngineForGpu(o, fabric::GpuMemory::kDirect);
  ASSERT_FALSE(direct.ok());
  EXPECT_EQ(direct.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(direct.status().message().find("cannot register GPU memory"), std::string::npos) << direct.status().ToString();
}

// A user of shm on libfabric 1.x hears of its dead-writer stall at start,
// in the line every agent logs; a 2.x shm carries no such caveat.
TEST(CapabilitiesTest, ShmBeforeLibfabricTwoNamesItsDeadWriterStall) {
  fabric::LibfabricOptions o;
  o.provider = "shm";
  auto engine = fabric::CreateLibfabricEngine(o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  const bool before_two = (*engine)->capabilities().library.rfind("libfabric 1.", 0) == 0;
  EXPECT_EQ((*engine)->capabilities().caveat.empty(), !before_two) << (*engine)->Describe();
  EXPECT_EQ((*engine)->Describe().find("caveat: shm before libfabric 2") != std::string::npos, before_two)
      << (*engine)->Describe();
}

// The shm CUDA check looks a parameter up by the name fi_getparams lists it
// under, its environment variable (looking for the defined name instead made
// every libfabric look too old: seen on an H200 with a 2.7 build).
TEST(CapabilitiesTest, ParametersAreFoundByTheirEnvironmentName) {
  fabric::LibfabricOptions o;
  o.provider = "shm";
  ASSERT_TRUE(fabric::CreateLibfabricEngine(o).ok());  // fi_getinfo has defined the core parameters
  EXPECT_TRUE(fabric::LibfabricDefinesParam("FI_PROVIDER"));
  EXPECT_TRUE(fabric::LibfabricDefinesParam("FI_LOG_LEVEL"));
  EXPECT_FALSE(fabric::LibfabricDefinesParam("provider"));
  EXPECT_FALSE(fabric::LibfabricDefinesParam("FI_NO_SUCH_PARAMETER"));
}

TEST(CapabilitiesTest, BooleanParametersAreOffAsLibfabricReadsThem) {
  for (const char* off : {"0", "no", "OFF", "False"}) {
    setenv("WSYNC_TEST_BOOL", off, 1);
    EXPECT_TRUE(fabric::EnvBoolOff("WSYNC_TEST_BOOL")) << off;
  }
  for (const char* on : {"1", "yes", "on", "true"}) {
    setenv("WSYNC_TEST_BOOL", on, 1);
    EXPECT_FALSE(fabric::EnvBoolOff("WSYNC_TEST_BOOL")) << on;
  }
  unsetenv("WSYNC_TEST_BOOL");
  EXPECT_FALSE(fabric::EnvBoolOff("WSYNC_TEST_BOOL"));
}

}  // namespace
}  // namespace wsync::transport
