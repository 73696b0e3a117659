#include "tests/inference_agent/test_roles.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <future>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "inference_agent/agent_command.h"
#include "inference_agent/descriptor_text.h"
#include "inference_agent/engine_view.h"
#include "transport/libfabric/libfabric_engine.h"

namespace wsync::inference::testing {
namespace {

void Reply(const std::string& line) {
  std::cout << line << std::endl;  // flushes: the test waits for it
}

struct PlannedWrite {
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

}  // namespace

int WriterMain(int argc, char** argv) {
  if (argc < 6) return 2;
  transport::fabric::LibfabricOptions options;
  options.provider = argv[2];
  options.num_nics = static_cast<uint32_t>(std::stoul(argv[3]));
  options.node = std::string(argv[4]) == "-" ? "" : argv[4];
  options.split_threshold = std::stoull(argv[5]);
  options.op_timeout = std::chrono::seconds(20);
  auto engine_or = transport::fabric::CreateLibfabricEngine(options);
  if (!engine_or.ok()) {
    Reply("error " + engine_or.status().ToString());
    return 1;
  }
  std::unique_ptr<transport::Engine> engine = std::move(engine_or).value();
  transport::RemoteMemory remote;
  std::vector<PlannedWrite> plan;
  std::vector<uint8_t> source;
  std::unique_ptr<transport::MemoryRegion> region;
  Reply("ready");

  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd == "desc") {
      std::string hex;
      in >> hex;
      auto desc = DescriptorFromText(hex);
      if (!desc.ok()) { Reply("error " + desc.status().ToString()); continue; }
      auto r = engine->Import(*desc);
      if (!r.ok()) { Reply("error " + r.status().ToString()); continue; }
      remote = *r;
      Reply("ok");
    } else if (cmd == "plan") {
      plan.clear();
      std::string entry;
      uint64_t end = 0;
      while (in >> entry) {
        const size_t colon = entry.find(':');
        PlannedWrite w{std::stoull(entry.substr(0, colon)), std::stoull(entry.substr(colon + 1))};
        end = std::max(end, w.offset + w.bytes);
        plan.push_back(w);
      }
      // The source mirrors the destination region, so a write's source and
      // destination offsets are equal.
      region.reset();
      source.assign(end, 0);
      auto r = engine->Register(source.data(), source.size());
      if (!r.ok()) { Reply("error " + r.status().ToString()); continue; }
      region = std::move(r).value();
      Reply("ok");
    } else if (cmd == "write") {
      uint64_t v = 0, seed = 0;
      std::string list;
      in >> v >> seed >> list;
      std::vector<size_t> which;
      std::istringstream items(list);
      for (std::string item; std::getline(items, item, ',');) which.push_back(std::stoul(item));
      std::atomic<int> left{static_cast<int>(which.size())};
      std::promise<Status> all;
      std::atomic<bool> failed{false};
      bool refused = false;
      for (size_t i : which) {
        const PlannedWrite& w = plan.at(i);
        for (uint64_t b = 0; b < w.bytes; ++b) source[w.offset + b] = PatternByte(seed, v, w.offset + b);
        transport::SingleWrite req{region.get(), w.offset, remote, w.offset, w.bytes, static_cast<uint32_t>(v)};
        Status s = engine->Write(req, [&](const Status& st) {
          if (!st.ok() && !failed.exchange(true)) all.set_value(st);
          if (--left == 0 && !failed.load()) all.set_value(Status::Ok());
        });
        if (!s.ok()) {
          Reply("error " + s.ToString());
          refused = true;
          break;
        }
      }
      if (refused) return 1;  // callbacks of earlier writes still reference this frame
      Status s = all.get_future().get();
      Reply(s.ok() ? "done" : "error " + s.ToString());
    } else if (cmd == "quit") {
      break;
    }
  }
  region.reset();
  return 0;
}

int EngineMain(int argc, char** argv) {
  if (argc < 6) return 2;
  const std::string shm = argv[2];
  const uint64_t v = std::stoull(argv[3]), seed = std::stoull(argv[4]);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(std::stol(argv[5]));
  StatusOr<EngineView> view = EngineView::Open(shm);
  if (!view.ok()) {
    Reply("error " + view.status().ToString());
    return 1;
  }
  while (view->complete_version() != v) {
    if (std::chrono::steady_clock::now() > deadline) {
      Reply("error complete_version is " + std::to_string(view->complete_version()) + ", waited for " +
            std::to_string(v));
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (int i = 6; i < argc; ++i) {
    // NAME:OFFSET:BYTES, from the spec the test built, not from the view.
    const std::string arg = argv[i];
    const size_t b = arg.rfind(':'), a = arg.rfind(':', b - 1);
    const std::string name = arg.substr(0, a);
    const uint64_t offset = std::stoull(arg.substr(a + 1, b - a - 1)), bytes = std::stoull(arg.substr(b + 1));
    const EngineTensor* t = view->Find(name);
    if (t == nullptr) {
      Reply("error no tensor '" + name + "'");
      return 1;
    }
    if (t->bytes != bytes) {
      Reply("error tensor '" + name + "' has " + std::to_string(t->bytes) + " bytes, expected " +
            std::to_string(bytes));
      return 1;
    }
    for (uint64_t k = 0; k < bytes; ++k) {
      if (t->data[k] != PatternByte(seed, v, offset + k)) {
        Reply("error tensor '" + name + "' byte " + std::to_string(k) + " is not version " + std::to_string(v) + "'s");
        return 1;
      }
    }
  }
  Reply("ok");
  return 0;
}

int PeekMain(int argc, char** argv) {
  if (argc < 3) return 2;
  StatusOr<EngineView> view = EngineView::Open(argv[2]);
  if (!view.ok()) {
    Reply("error " + view.status().ToString());
    return 1;
  }
  Reply("complete " + std::to_string(view->complete_version()) + " failed " + std::to_string(view->failed_version()));
  return 0;
}

int AgentMain(int argc, char** argv) {
  InferenceAgentFlags flags;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string key = arg.substr(0, eq), value = arg.substr(eq + 1);
    if (key == "controller") flags.controller = value;
    else if (key == "rank") flags.rank = std::stoi(value);
    else if (key == "layout") flags.layout = value;
    else if (key == "provider") flags.provider = value;
    else if (key == "nics") flags.nics = static_cast<uint32_t>(std::stoul(value));
    else if (key == "node") flags.node = value;
    else if (key == "shm") flags.shm_name = value;
    else if (key == "version_timeout") flags.version_timeout_s = std::stod(value);
    else return 2;
  }
  return RunInferenceAgentCommand(flags);
}

}  // namespace wsync::inference::testing
