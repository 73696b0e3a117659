#include "demo/rank0_baseline.h"

#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include "demo/process.h"
#include "transport/libfabric/libfabric_engine.h"

namespace wsync::demo {
namespace fs = std::filesystem;
using transport::Engine;

namespace {

constexpr uint32_t kGatherImm = 1;  // phase 1: into trainer rank 0
constexpr uint32_t kSendImm = 2;    // phase 2: into an inference rank

int64_t MonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

Status WriteFileAtomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    f << bytes;
    if (!f) return Internal("cannot write '" + tmp + "'");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return Internal("cannot rename '" + tmp + "': " + ec.message());
  return Status::Ok();
}

// Waits until `path` exists; returns its content.
StatusOr<std::string> WaitForFile(const std::string& path, double timeout_s) {
  const int64_t deadline = MonotonicNs() + static_cast<int64_t>(timeout_s * 1e9);
  struct stat st {};
  while (stat(path.c_str(), &st) != 0) {
    if (MonotonicNs() > deadline) return DeadlineExceeded("no file '" + path + "' after " + std::to_string(timeout_s) + " s");
    usleep(200);
  }
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

uint32_t Arrivals(const Engine& engine, uint64_t bytes, uint64_t chunk) {
  uint32_t n = 0;
  for (uint64_t off = 0; off < bytes; off += chunk) n += engine.ArrivalsPerWrite(std::min(chunk, bytes - off));
  return n;
}

// Outstanding writes of one round; Wait returns the first error.
class WriteBatch {
 public:
  Status Add(Engine& engine, transport::SingleWrite w) {
    ++pending_;
    Status s = engine.Write(std::move(w), [this](const Status& st) { Done(st); });
    if (!s.ok()) Done(s);
    return s;
  }
  Status Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return pending_ == 0; });
    return first_error_;
  }

 private:
  void Done(const Status& s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!s.ok() && first_error_.ok()) first_error_ = s;
    if (--pending_ == 0) cv_.notify_all();
  }
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t pending_ = 0;
  Status first_error_;
};

Status ExpectAll(Engine& engine, uint32_t imm, uint32_t count, double timeout_s) {
  if (count == 0) return Status::Ok();
  std::promise<Status> fired;
  const auto deadline = transport::Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  WSYNC_RETURN_IF_ERROR(engine.Expect(imm, count, [&](const Status& s) { fired.set_value(s); }, deadline));
  return fired.get_future().get();
}

Status RunPeer(const Rank0PeerOptions& o) {
  transport::fabric::LibfabricOptions fo;
  fo.provider = o.provider;
  fo.num_nics = 1;
  fo.node = o.node;
  fo.op_timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, transport::fabric::CreateLibfabricEngine(fo));
  const bool trainer = o.role == "trainer";
  if (!trainer && o.role != "inference") return InvalidArgument("--role must be trainer or inference, not '" + o.role + "'");
  const auto& sizes = trainer ? o.shard_bytes : o.inference_bytes;
  if (o.rank < 0 || static_cast<size_t>(o.rank) >= sizes.size()) {
    return InvalidArgument(o.role + " rank " + std::to_string(o.rank) + " has no byte count");
  }
  uint64_t total_shards = 0;
  std::vector<uint64_t> shard_offset;
  for (uint64_t b : o.shard_bytes) {
    shard_offset.push_back(total_shards);
    total_shards += b;
  }
  // Rank 0 holds the whole gathered model; everyone else its own bytes.
  const uint64_t length = std::max<uint64_t>(1, trainer && o.rank == 0 ? total_shards : sizes[o.rank]);
  std::unique_ptr<uint8_t[]> buffer(new uint8_t[length]);
  std::memset(buffer.get(), 0x11 * (o.rank + 1), length);  // touched, so no page faults while timed
  WSYNC_ASSIGN_OR_RETURN(auto region, engine->Register(buffer.get(), length));
  const std::string name = o.role + "-" + std::to_string(o.rank);
  auto import = [&](const std::string& peer) -> StatusOr<transport::RemoteMemory> {
    WSYNC_ASSIGN_OR_RETURN(std::string bytes, WaitForFile(o.dir + "/" + peer + ".desc", o.timeout_s));
    WSYNC_ASSIGN_OR_RETURN(transport::MemoryDescriptor desc, transport::MemoryDescriptor::Parse(bytes));
    return engine->Import(desc);
  };

  std::vector<transport::RemoteMemory> targets;  // rank 0: inference ranks; others: rank 0
  if (!trainer || o.rank == 0) WSYNC_RETURN_IF_ERROR(WriteFileAtomically(o.dir + "/" + name + ".desc", region->descriptor().Serialize()));
  if (trainer && o.rank == 0) {
    for (size_t i = 0; i < o.inference_bytes.size(); ++i) {
      WSYNC_ASSIGN_OR_RETURN(auto remote, import("inference-" + std::to_string(i)));
      targets.push_back(remote);
    }
  } else if (trainer) {
    WSYNC_ASSIGN_OR_RETURN(auto remote, import("trainer-0"));
    targets.push_back(remote);
  }
  std::printf("ready\n");
  std::fflush(stdout);

  uint32_t gather_count = 0;
  for (size_t r = 1; r < o.shard_bytes.size(); ++r) gather_count += Arrivals(*engine, o.shard_bytes[r], o.chunk);
  for (int round = 1; round <= o.rounds; ++round) {
    WSYNC_RETURN_IF_ERROR(WaitForFile(o.dir + "/go-" + std::to_string(round), o.timeout_s).status());
    if (!trainer) {
      WSYNC_RETURN_IF_ERROR(ExpectAll(*engine, kSendImm, Arrivals(*engine, sizes[o.rank], o.chunk), o.timeout_s));
      std::printf("done %d %lld\n", round, static_cast<long long>(MonotonicNs()));
      std::fflush(stdout);
      continue;
    }
    WriteBatch batch;
    if (o.rank != 0) {
      for (uint64_t off = 0; off < sizes[o.rank]; off += o.chunk) {
        const uint64_t len = std::min(o.chunk, sizes[o.rank] - off);
        WSYNC_RETURN_IF_ERROR(batch.Add(*engine, {region.get(), off, targets[0], shard_offset[o.rank] + off, len, kGatherImm}));
      }
    } else {
      WSYNC_RETURN_IF_ERROR(ExpectAll(*engine, kGatherImm, gather_count, o.timeout_s));
      // Phase 2: chunks to the inference ranks interleaved, as a broadcast
      // from one NIC would; source bytes wrap around the gathered model.
      uint64_t src = 0;
      std::vector<uint64_t> src_base;
      for (uint64_t b : o.inference_bytes) {
        if (src + b > length) src = 0;
        src_base.push_back(src);
        src += b;
      }
      for (uint64_t off = 0;; off += o.chunk) {
        bool any = false;
        for (size_t i = 0; i < targets.size(); ++i) {
          if (off >= o.inference_bytes[i]) continue;
          any = true;
          const uint64_t len = std::min(o.chunk, o.inference_bytes[i] - off);
          WSYNC_RETURN_IF_ERROR(batch.Add(*engine, {region.get(), src_base[i] + off, targets[i], off, len, kSendImm}));
        }
        if (!any) break;
      }
    }
    WSYNC_RETURN_IF_ERROR(batch.Wait());
  }
  std::printf("finished\n");
  std::fflush(stdout);
  // Stay reachable until the harness stops us (late completions of peers).
  while (true) pause();
}

std::string JoinBytes(const std::vector<uint64_t>& v) {
  std::string s;
  for (uint64_t b : v) {
    if (!s.empty()) s.push_back(',');
    s.append(std::to_string(b));
  }
  return s;
}

}  // namespace

int RunRank0Peer(const Rank0PeerOptions& options) {
  Status s = RunPeer(options);
  std::fprintf(stderr, "rank0-peer %s %d: %s\n", options.role.c_str(), options.rank, s.ToString().c_str());
  return s.ok() ? 0 : 1;
}

StatusOr<Rank0BaselineResult> RunRank0Baseline(const Rank0BaselineOptions& o) {
  std::error_code ec;
  const std::string dir = o.work_dir + "/rank0";
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  if (ec) return Internal("cannot create '" + dir + "': " + ec.message());
  auto spawn = [&](const std::string& role, size_t rank, const HostPlacement& host) -> StatusOr<ChildProcess> {
    std::vector<std::string> argv;
    if (!host.netns.empty()) argv = {"ip", "netns", "exec", host.netns};
    argv.insert(argv.end(), {o.binary, "bench", "rank0-peer", "--role", role, "--rank", std::to_string(rank),
                             "--dir", dir, "--provider", o.provider, "--node", host.address,
                             "--shard-bytes", JoinBytes(o.shard_bytes), "--inference-bytes", JoinBytes(o.inference_bytes),
                             "--rounds", std::to_string(o.rounds), "--timeout", std::to_string(o.timeout_s)});
    const std::string name = role + "-" + std::to_string(rank);
    return ChildProcess::Spawn("rank-0 baseline " + role + " " + std::to_string(rank), argv, dir + "/" + name + ".log");
  };
  std::vector<ChildProcess> inference, trainers;
  for (size_t i = 0; i < o.inference.size(); ++i) {
    WSYNC_ASSIGN_OR_RETURN(ChildProcess p, spawn("inference", i, o.inference[i]));
    inference.push_back(std::move(p));
  }
  for (size_t r = 0; r < o.trainers.size(); ++r) {
    WSYNC_ASSIGN_OR_RETURN(ChildProcess p, spawn("trainer", r, o.trainers[r]));
    trainers.push_back(std::move(p));
  }
  for (auto* group : {&inference, &trainers}) {
    for (ChildProcess& p : *group) WSYNC_RETURN_IF_ERROR(p.WaitForLine("ready", std::chrono::seconds(120)));
  }
  Rank0BaselineResult result;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  for (int round = 1; round <= o.rounds; ++round) {
    const int64_t t0 = MonotonicNs();
    WSYNC_RETURN_IF_ERROR(WriteFileAtomically(dir + "/go-" + std::to_string(round), "go"));
    int64_t last = t0;
    for (ChildProcess& p : inference) {
      while (true) {
        WSYNC_ASSIGN_OR_RETURN(std::string line, p.ReadLine(timeout));
        int got_round = 0;
        long long ns = 0;
        if (std::sscanf(line.c_str(), "done %d %lld", &got_round, &ns) == 2 && got_round == round) {
          last = std::max<int64_t>(last, ns);
          break;
        }
      }
    }
    result.round_seconds.push_back((last - t0) / 1e9);
  }
  for (ChildProcess& p : trainers) WSYNC_RETURN_IF_ERROR(p.WaitForLine("finished", timeout));
  trainers.clear();
  inference.clear();
  std::vector<double> timed(result.round_seconds.begin() + (o.rounds > 1 ? 1 : 0), result.round_seconds.end());
  std::sort(timed.begin(), timed.end());
  const size_t n = timed.size();
  result.seconds = n % 2 == 1 ? timed[n / 2] : (timed[n / 2 - 1] + timed[n / 2]) / 2;
  for (size_t r = 1; r < o.shard_bytes.size(); ++r) result.gathered_bytes += o.shard_bytes[r];
  for (uint64_t b : o.inference_bytes) result.sent_bytes += b;
  return result;
}

std::vector<uint64_t> TrainerShardBytes(const TrainerSpec& trainer) {
  std::vector<uint64_t> bytes;
  for (const TrainerRank& rank : trainer.ranks) {
    uint64_t n = 0;
    for (const TrainerParam& p : rank.params) {
      uint64_t elems = 1;
      for (int64_t d : p.local_shape) elems *= static_cast<uint64_t>(d);
      n += elems * DTypeSize(p.dtype);
    }
    bytes.push_back(n);
  }
  return bytes;
}

std::vector<uint64_t> InferenceWireBytes(const RoutingTable& table, size_t inference_ranks) {
  std::vector<uint64_t> bytes(inference_ranks, 0);
  for (const WriteOp& op : table.ops) bytes[op.dst_rank] += op.bytes;
  return bytes;
}

}  // namespace wsync::demo
