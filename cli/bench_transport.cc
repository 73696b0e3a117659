// `wsync bench transport`: one-way RDMA write bandwidth, operation rate and
// latency of the transfer engine, per message size and pattern (single,
// paged), beside this machine's single-core memcpy bandwidth measured in
// the same run (the ceiling for shm, whose writes are one kernel copy).
//
// A receiver process is forked before any engine thread exists; it
// registers the target region, hands its descriptor back through a pipe
// and stays passive until the pipe closes.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "transport/libfabric/libfabric_engine.h"

namespace wsync::cli {
namespace {

using transport::Engine;
using transport::MemoryRegion;
using transport::RemoteMemory;
using Clock = std::chrono::steady_clock;

struct BenchOptions {
  std::string provider = "shm";
  std::string node;
  uint32_t nics = 1;
  uint64_t min_size = 4 << 10;
  uint64_t max_size = 64 << 20;
  uint64_t page = 16 << 10;
  uint64_t split_threshold = 0;  // 0: engine default
  uint32_t window = 64;
  double seconds = 0.25;
  std::vector<std::string> patterns = {"single", "paged"};
  std::string format = "text";
  bool imm = false;
  bool small_pages = false;  // 4 KiB pages instead of THP (as fabtests' buffers)
  // Worker cores (-1: unpinned). Measured on 2 cores: pinning the receiver
  // too lets the writer's other threads preempt it inside shm's region lock.
  int sender_core = 0;
  int receiver_core = -1;
};

struct Point {
  std::string pattern;
  uint64_t size;
  double gbps, ops_per_s, p50_us, p99_us;
};

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Bench buffers: 2 MiB-aligned and backed by transparent huge pages where
// the kernel allows (THP "madvise" mode), as large pinned weight buffers
// usually are; 4 KiB pages make every kernel copy walk 512x more PTEs.
struct FreeDeleter {
  void operator()(char* p) const noexcept { std::free(p); }
};
std::unique_ptr<char, FreeDeleter> HugeBuffer(size_t bytes, char fill, bool huge) {
  constexpr size_t kHuge = 2 << 20;
  const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
  char* p = static_cast<char*>(std::aligned_alloc(kHuge, rounded));
  if (p != nullptr) {
    madvise(p, rounded, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    std::memset(p, fill, rounded);
  }
  return std::unique_ptr<char, FreeDeleter>(p);
}

// Single-core memcpy bandwidth at one message size, copying between the
// same two buffers again and again as the bench's writes do (so small sizes
// are as cache-resident for the ceiling as for the engine).
double MemcpyGbps(size_t bytes, bool huge) {
  auto a = HugeBuffer(bytes, 1, huge), b = HugeBuffer(bytes, 2, huge);
  std::memcpy(b.get(), a.get(), bytes);
  uint64_t copied = 0;
  const auto t0 = Clock::now();
  while (Seconds(Clock::now() - t0) < 0.05 || copied < 4 * bytes) {
    for (int i = 0; i < 8; ++i) {
      std::memcpy(b.get(), a.get(), bytes);
      asm volatile("" ::"r"(b.get()) : "memory");  // every copy happens
    }
    copied += 8 * bytes;
  }
  return copied / Seconds(Clock::now() - t0) / 1e9;
}

transport::fabric::LibfabricOptions EngineOptions(const BenchOptions& o) {
  transport::fabric::LibfabricOptions e;
  e.provider = o.provider;
  e.node = o.node;
  e.num_nics = o.nics;
  if (o.split_threshold != 0) e.split_threshold = o.split_threshold;
  return e;
}

// Receiver: registers max_size bytes, writes its descriptor to `out`, waits
// for EOF on `in`. Runs in the forked child; exits without returning.
[[noreturn]] void RunReceiver(const BenchOptions& o, int in, int out) {
  auto options = EngineOptions(o);
  // The target must poll: shm queues a notice of every write (even its
  // fast path) in the target's command queue, and the writer gets FI_EAGAIN
  // once that fills; tcp;ofi_rxm and immediates need the target outright.
  // Napping instead capped shm at ~20K writes/s.
  options.idle_after = std::chrono::microseconds(0);
  options.core = o.receiver_core;
  auto engine = transport::fabric::CreateLibfabricEngine(options);
  std::string reply;
  std::unique_ptr<char, FreeDeleter> buffer;
  std::unique_ptr<MemoryRegion> region;
  if (engine.ok()) {
    buffer = HugeBuffer(o.max_size, 0, !o.small_pages);
    auto r = (*engine)->Register(buffer.get(), o.max_size);
    if (r.ok()) {
      region = std::move(r).value();
      reply = "D" + region->descriptor().Serialize();
    } else {
      reply = "E" + r.status().ToString();
    }
  } else {
    reply = "E" + engine.status().ToString();
  }
  uint64_t n = reply.size();
  if (write(out, &n, sizeof(n)) != sizeof(n) || write(out, reply.data(), n) != static_cast<ssize_t>(n)) _exit(1);
  char c;
  while (read(in, &c, 1) > 0) {
  }
  region.reset();
  if (engine.ok()) engine->reset();  // closes endpoints: shm removes its region
  _exit(0);
}

class Driver {
 public:
  Driver(Engine* engine, const BenchOptions& o, const MemoryRegion* src, const RemoteMemory& dst)
      : engine_(engine), o_(o), src_(src), dst_(dst) {}

  Point Measure(const std::string& pattern, uint64_t size) {
    pattern_ = pattern;
    size_ = size;
    page_ = std::min(o_.page, size);
    if (pattern == "paged") {
      const uint32_t pages = static_cast<uint32_t>(size / page_);
      src_idx_.resize(pages);
      std::iota(src_idx_.begin(), src_idx_.end(), 0);
      dst_idx_ = src_idx_;
      std::shuffle(dst_idx_.begin(), dst_idx_.end(), std::mt19937(1));
    }
    const uint32_t ops_per_request = pattern == "paged" ? static_cast<uint32_t>(size / page_) : 1;
    const uint32_t window = std::max<uint32_t>(2, o_.window / ops_per_request);
    Point p{pattern, size, 0, 0, 0, 0};
    RunWindow(window, 0.02);  // warm-up: registration caches, connections
    const auto [ops, secs] = RunWindow(window, o_.seconds);
    p.ops_per_s = ops / secs;
    p.gbps = ops * static_cast<double>(size) / secs / 1e9;
    std::vector<double> lat = Latencies(std::clamp<int>(static_cast<int>(0.1 / std::max(1e-6, secs / ops)), 20, 400));
    std::sort(lat.begin(), lat.end());
    p.p50_us = lat[lat.size() / 2];
    p.p99_us = lat[std::min(lat.size() - 1, lat.size() * 99 / 100)];
    return p;
  }

  Status failure() const { return failure_; }

 private:
  Status Submit(transport::Callback cb) {
    std::optional<uint32_t> imm;
    if (o_.imm) imm = 1;
    if (pattern_ == "paged") {
      transport::PagedWrite w;
      w.src = src_;
      w.src_pages.indices = src_idx_;
      w.src_pages.stride = page_;
      w.dst = dst_;
      w.dst_pages.indices = dst_idx_;
      w.dst_pages.stride = page_;
      w.page_length = page_;
      w.imm = imm;
      return engine_->WritePaged(std::move(w), std::move(cb));
    }
    return engine_->Write({src_, 0, dst_, 0, size_, imm}, std::move(cb));
  }

  // Keeps `window` requests outstanding for `secs`; each completion's
  // callback submits the next, so no thread sleeps between operations.
  std::pair<uint64_t, double> RunWindow(uint32_t window, double secs) {
    std::atomic<uint64_t> done{0};
    std::atomic<int64_t> outstanding{0};
    std::atomic<bool> stop{false};
    std::promise<void> drained;
    const auto t0 = Clock::now();
    std::function<void(const Status&)> on_done = [&](const Status& s) {
      if (!s.ok() && failure_.ok()) failure_ = s;
      done.fetch_add(1, std::memory_order_relaxed);
      if (!stop.load(std::memory_order_relaxed) && s.ok() && Seconds(Clock::now() - t0) < secs) {
        if (Submit(on_done).ok()) return;
      }
      stop.store(true);
      if (outstanding.fetch_sub(1) == 1) drained.set_value();
    };
    outstanding.store(window);
    for (uint32_t i = 0; i < window; ++i) {
      if (!Submit(on_done).ok() && outstanding.fetch_sub(1) == 1) drained.set_value();
    }
    drained.get_future().wait();
    return {done.load(), Seconds(Clock::now() - t0)};
  }

  // One request at a time; submit-to-callback time of each.
  std::vector<double> Latencies(int n) {
    std::vector<double> out;
    out.reserve(n);
    std::promise<void> finished;
    Clock::time_point start;
    std::function<void(const Status&)> on_done = [&](const Status& s) {
      out.push_back(Seconds(Clock::now() - start) * 1e6);
      if (static_cast<int>(out.size()) == n || !s.ok()) {
        finished.set_value();
        return;
      }
      start = Clock::now();
      if (!Submit(on_done).ok()) finished.set_value();
    };
    start = Clock::now();
    if (!Submit(on_done).ok()) return {0.0};
    finished.get_future().wait();
    return out.empty() ? std::vector<double>{0.0} : out;
  }

  Engine* engine_;
  const BenchOptions& o_;
  const MemoryRegion* src_;
  RemoteMemory dst_;
  std::string pattern_;
  uint64_t size_ = 0, page_ = 0;
  std::vector<uint32_t> src_idx_, dst_idx_;
  Status failure_;
};

std::string SizeName(uint64_t s) {
  if (s >= (1 << 20) && s % (1 << 20) == 0) return std::to_string(s >> 20) + " MiB";
  if (s >= (1 << 10) && s % (1 << 10) == 0) return std::to_string(s >> 10) + " KiB";
  return std::to_string(s) + " B";
}

int RunBench(const BenchOptions& o) {
  if (o.min_size == 0 || o.min_size > o.max_size) {
    std::fprintf(stderr, "bench transport: --min-size must be > 0 and <= --max-size\n");
    return 2;
  }
  // Ceilings first, before any engine thread competes for the cores.
  std::vector<double> ceilings;
  for (uint64_t size = o.min_size; size <= o.max_size; size *= 2) ceilings.push_back(MemcpyGbps(size, !o.small_pages));
  int to_child[2], from_child[2];
  if (pipe(to_child) != 0 || pipe(from_child) != 0) {
    std::perror("bench transport: pipe");
    return 1;
  }
  const pid_t child = fork();
  if (child == 0) {
    close(to_child[1]);
    close(from_child[0]);
    RunReceiver(o, to_child[0], from_child[1]);
  }
  close(to_child[0]);
  close(from_child[1]);
  auto finish = [&](int rc) {
    close(to_child[1]);
    waitpid(child, nullptr, 0);
    return rc;
  };
  uint64_t n = 0;
  std::string reply;
  if (read(from_child[0], &n, sizeof(n)) == sizeof(n)) {
    reply.resize(n);
    size_t got = 0;
    while (got < n) {
      ssize_t r = read(from_child[0], reply.data() + got, n - got);
      if (r <= 0) break;
      got += r;
    }
  }
  if (reply.empty() || reply[0] != 'D') {
    std::fprintf(stderr, "bench transport: receiver failed: %s\n", reply.empty() ? "no reply" : reply.c_str() + 1);
    return finish(1);
  }
  auto desc = transport::MemoryDescriptor::Parse(std::string_view(reply).substr(1));
  auto options = EngineOptions(o);
  options.idle_after = std::chrono::microseconds(0);  // spin: this is the measurement
  options.core = o.sender_core;
  auto engine = transport::fabric::CreateLibfabricEngine(options);
  if (!engine.ok() || !desc.ok()) {
    std::fprintf(stderr, "bench transport: %s\n", (engine.ok() ? desc.status() : engine.status()).ToString().c_str());
    return finish(1);
  }
  auto remote = (*engine)->Import(*desc);
  std::unique_ptr<char, FreeDeleter> src = HugeBuffer(o.max_size, 7, !o.small_pages);
  auto region = (*engine)->Register(src.get(), o.max_size);
  if (!remote.ok() || !region.ok()) {
    std::fprintf(stderr, "bench transport: %s\n", (remote.ok() ? region.status() : remote.status()).ToString().c_str());
    return finish(1);
  }
  const bool json = o.format == "json";
  if (!json) {
    std::printf("wsync bench transport: provider %s, %u NIC(s), window %u, %s, %s\n", o.provider.c_str(), o.nics,
                o.window, o.imm ? "write-with-immediate" : "plain writes",
                o.small_pages ? "4 KiB pages" : "huge-page buffers");
    std::printf("writer: %s\n", (*engine)->Describe().c_str());
    std::printf("ceiling: single-core memcpy of the same size, same run\n");
    std::printf("%-7s %9s %9s %11s %9s %9s %9s %7s\n", "pattern", "size", "GB/s", "ops/s", "p50_us", "p99_us",
                "ceiling", "ratio");
  }
  Driver driver(engine->get(), o, region->get(), *remote);
  for (const std::string& pattern : o.patterns) {
    size_t k = 0;
    for (uint64_t size = o.min_size; size <= o.max_size; size *= 2, ++k) {
      const double ceiling = ceilings[k];
      Point p = driver.Measure(pattern, size);
      if (!driver.failure().ok()) {
        std::fprintf(stderr, "bench transport: %s %s: %s\n", pattern.c_str(), SizeName(size).c_str(),
                     driver.failure().ToString().c_str());
        region->reset();
        engine->reset();
        return finish(1);
      }
      if (json) {
        std::printf("{\"size\": %llu, \"pattern\": \"%s\", \"provider\": \"%s\", \"nics\": %u, \"gbps\": %.3f, "
                    "\"ops_per_s\": %.1f, \"p50_us\": %.2f, \"p99_us\": %.2f, \"ceiling_gbps\": %.3f, "
                    "\"ratio\": %.3f}\n",
                    static_cast<unsigned long long>(size), pattern.c_str(), o.provider.c_str(), o.nics, p.gbps,
                    p.ops_per_s, p.p50_us, p.p99_us, ceiling, p.gbps / ceiling);
      } else {
        std::printf("%-7s %9s %9.2f %11.0f %9.1f %9.1f %9.2f %6.0f%%\n", pattern.c_str(), SizeName(size).c_str(),
                    p.gbps, p.ops_per_s, p.p50_us, p.p99_us, ceiling, 100 * p.gbps / ceiling);
      }
      std::fflush(stdout);
    }
  }
  region->reset();
  engine->reset();
  return finish(0);
}

}  // namespace

void AddBenchTransport(CLI::App& bench) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = bench.add_subcommand("transport", "engine write bandwidth/latency vs single-core memcpy");
  cmd->add_option("--provider", o->provider, "libfabric provider: shm, tcp;ofi_rxm, verbs;ofi_rxm, efa");
  cmd->add_option("--node", o->node, "local address to bind (tcp: an interface IP)");
  cmd->add_option("--nics", o->nics, "endpoints (NICs) per engine");
  cmd->add_option("--min-size", o->min_size, "smallest message (e.g. 4KiB)")->transform(CLI::AsSizeValue(false));
  cmd->add_option("--max-size", o->max_size, "largest message (e.g. 64MiB)")->transform(CLI::AsSizeValue(false));
  cmd->add_option("--page", o->page, "page size of the paged pattern")->transform(CLI::AsSizeValue(false));
  cmd->add_option("--split-threshold", o->split_threshold, "split single writes across NICs from this size")
      ->transform(CLI::AsSizeValue(false));
  cmd->add_option("--window", o->window, "operations kept in flight");
  cmd->add_option("--seconds", o->seconds, "measuring time per size and pattern");
  cmd->add_option("--pattern", o->patterns, "single and/or paged")->check(CLI::IsMember({"single", "paged"}));
  cmd->add_option("--format", o->format, "text or json (one record per line)")->check(CLI::IsMember({"text", "json"}));
  cmd->add_flag("--imm", o->imm, "every write carries an immediate");
  cmd->add_flag("--small-pages", o->small_pages, "buffers on 4 KiB pages instead of transparent huge pages");
  cmd->add_option("--sender-core", o->sender_core, "pin the sending worker to this core (-1: no pinning)");
  cmd->add_option("--receiver-core", o->receiver_core, "pin the receiving worker to this core (-1: no pinning)");
  cmd->callback([o] {
    const int rc = RunBench(*o);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace wsync::cli
