// Fixture for multi-process engine tests: an engine in the test process
// (the writer) and transport_peer processes as targets, meeting through
// files in a fresh temp directory.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "tests/transport/peer_files.h"
#include "tests/transport/peer_process.h"
#include "transport/libfabric/libfabric_engine.h"

namespace wsync::transport::testing {

class EngineTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/wsync-transport-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    options_.provider = GetParam();
    if (options_.provider.rfind("tcp", 0) == 0) options_.node = "127.0.0.1";
    options_.op_timeout = std::chrono::seconds(20);
  }
  void TearDown() override {
    peers_.clear();  // kill targets first: nothing waits on them any more
    engine_.reset();
    std::filesystem::remove_all(dir_);
  }

  void StartEngine(uint32_t nics = 1) {
    options_.num_nics = nics;
    auto engine = fabric::CreateLibfabricEngine(options_);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    engine_ = std::move(engine).value();
    WriteFileAtomically(dir_ + "/self.addr", engine_->local_address().Serialize());
  }

  // Starts a target that registers `bytes`, expects `count` arrivals of
  // `imm`, then dumps its buffer.
  void StartTarget(const std::string& name, uint64_t bytes, uint32_t imm, uint32_t count,
                   std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {TRANSPORT_PEER_PATH, "dir=" + dir_, "name=" + name,
                                     "provider=" + options_.provider, "nics=" + std::to_string(options_.num_nics),
                                     "node=" + options_.node, "bytes=" + std::to_string(bytes),
                                     "imm=" + std::to_string(imm), "count=" + std::to_string(count),
                                     "timeout_ms=20000", "linger=1", "reply_to=" + dir_ + "/self.addr"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    peers_.push_back(std::make_unique<PeerProcess>(argv));
  }

  RemoteMemory Import(const std::string& name) {
    auto bytes = WaitForFile(dir_ + "/" + name + ".desc", std::chrono::seconds(20));
    EXPECT_TRUE(bytes.has_value()) << "target " << name << " published no descriptor";
    if (!bytes) return {};
    auto desc = MemoryDescriptor::Parse(*bytes);
    EXPECT_TRUE(desc.ok()) << desc.status().ToString();
    auto remote = engine_->Import(*desc);
    EXPECT_TRUE(remote.ok()) << remote.status().ToString();
    return remote.ok() ? *remote : RemoteMemory{};
  }

  // "ok" or the target's error line.
  std::string Result(const std::string& name, std::chrono::seconds timeout = std::chrono::seconds(30)) {
    auto r = WaitForFile(dir_ + "/" + name + ".result", timeout);
    return r ? *r : "no result from " + name;
  }
  std::string TargetBytes(const std::string& name) {
    auto r = ReadFile(dir_ + "/" + name + ".bin");
    return r ? *r : std::string();
  }

  std::unique_ptr<MemoryRegion> RegisterOrDie(std::vector<uint8_t>& buffer) {
    auto region = engine_->Register(buffer.data(), buffer.size());
    EXPECT_TRUE(region.ok()) << region.status().ToString();
    return region.ok() ? std::move(region).value() : nullptr;
  }

  // Submits through `submit` and waits for the callback (bounded).
  template <typename Submit>
  Status Await(Submit submit, std::chrono::seconds timeout = std::chrono::seconds(30)) {
    auto done = std::make_shared<std::promise<Status>>();
    std::future<Status> result = done->get_future();
    Status st = submit([done](const Status& s) { done->set_value(s); });
    if (!st.ok()) return st;
    if (result.wait_for(timeout) != std::future_status::ready)
      return DeadlineExceeded("test: callback did not run within " + std::to_string(timeout.count()) + " s");
    return result.get();
  }

  std::string dir_;
  fabric::LibfabricOptions options_;
  std::unique_ptr<Engine> engine_;
  std::vector<std::unique_ptr<PeerProcess>> peers_;
};

inline std::string ProviderName(const ::testing::TestParamInfo<std::string>& info) {
  return info.param == "shm" ? "shm" : "tcp_rxm";
}

}  // namespace wsync::transport::testing
