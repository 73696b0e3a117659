// PlanExecutor end to end, ranks as threads: 4 trainer ranks read their
// shards from shared memory (ShardExport/ShardView), all-gather over real
// Gloo, quantize, and write with real libfabric into 2 receivers' memory;
// every destination byte is compared with a reference built by hand from the
// full weights (tests/trainer_agent/update_fixture.cc).
#include "delta/codec.h"
#include "delta/inbox.h"
#include "pipeline/box_pack.h"
#include "pipeline/collectives.h"
#include "pipeline/fp8.h"
#include "pipeline/executor.h"
#include "pipeline/staged_group.h"
#include "routing/planner.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <set>
#include <thread>

#include "tests/trainer_agent/update_fixture.h"
#include "trainer_agent/shard_export.h"
#include "transport/libfabric/libfabric_engine.h"

namespace wsync {
namespace {

using std::chrono::milliseconds;
using testing::kInference;
using testing::kTrainers;
using trainer_agent::ShardExport;
using trainer_agent::ShardView;
using Clock = std::chrono::steady_clock;

// DeviceOps over host memory whose stages run only at Synchronize, as on a
// stream: a write posted before the executor waited for the device would
// carry stale bytes, which the receivers' byte check would see. Stands in
// for the GPU (python/src/torch_device.cc) to test the executor's device
// path here; the GPU itself is tested by python/tests/gpu/gpu_sync.py.
class DeferredHostDevice : public DeviceOps {
 public:
  std::string name() const override { return "deferred-host"; }
  transport::MemoryKind kind() const override { return transport::MemoryKind::kHost; }
  int ordinal() const override { return 0; }
  StatusOr<void*> Allocate(uint64_t bytes) override {
    void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (p == nullptr) return Internal("out of memory");
    allocations_[p] = bytes;
    return p;
  }
  void Free(void* p) override {
    allocations_.erase(p);
    std::free(p);
  }
  Status Copy(void* dst, const void* src, uint64_t bytes) override {
    return Defer([=] { std::memcpy(dst, src, bytes); });
  }
  Status Zero(void* dst, uint64_t bytes) override {
    return Defer([=] { std::memset(dst, 0, bytes); });
  }
  Status Copy2D(void* dst, uint64_t dst_pitch, const void* src, uint64_t src_pitch, uint64_t width,
                uint64_t rows) override {
    return Defer([=] {
      for (uint64_t i = 0; i < rows; ++i)
        std::memcpy(static_cast<uint8_t*>(dst) + i * dst_pitch, static_cast<const uint8_t*>(src) + i * src_pitch,
                    width);
    });
  }
  // With claims_device_memory, what Allocate gave is "device memory" (as
  // the GPU's arena is): collectives through host memory stage it.
  bool CanRead(const void* p) override {
    if (!claims_device_memory) return false;
    const auto* b = static_cast<const uint8_t*>(p);
    for (const auto& [start, bytes] : allocations_) {
      const auto* s = static_cast<const uint8_t*>(start);
      if (b >= s && b < s + bytes) return true;
    }
    return false;
  }
  Status PackBox(const uint8_t* data, const Box& held, DType from, const Box& box, DType to, uint8_t* out) override {
    return Defer([=] { wsync::PackBox(data, held, from, box, to, out); });
  }
  Status QuantizeHeld(const uint16_t* data, const Box& held, uint8_t* q, float* scales) override {
    const size_t index = quantizes_.size();
    quantizes_.push_back(false);
    return Defer([=, this] { quantizes_[index] = !wsync::QuantizeHeld(data, held, q, scales).ok(); });
  }
  Status Synchronize(std::vector<bool>* nonfinite) override {
    for (auto& op : queue_) op();
    queue_.clear();
    ++synchronizes;
    *nonfinite = std::move(quantizes_);
    quantizes_.clear();
    return Status::Ok();
  }
  Status ReadBack(void* host, const void* src, uint64_t bytes) override {
    if (!queue_.empty()) return Internal("read back before Synchronize");
    std::memcpy(host, src, bytes);
    return Status::Ok();
  }
  // As a stream synchronize: everything issued first, then the copy.
  Status CopyFromHost(void* dst, const void* host, uint64_t bytes) override {
    for (auto& op : queue_) op();
    queue_.clear();
    std::memcpy(dst, host, bytes);
    copied_from_host += bytes;
    return Status::Ok();
  }
  // The host mirror starts as bytes no plan writes: a write sent from it
  // before its copy ran lands them.
  StatusOr<void*> AllocateHost(uint64_t bytes) override {
    StatusOr<void*> p = Allocate(bytes);
    if (p.ok()) std::memset(*p, 0xA5, bytes);
    ++host_allocations;
    return p;
  }
  void FreeHost(void* p) override { std::free(p); }
  Status CopyToHost(void* host, const void* src, uint64_t bytes) override {
    copied_to_host += bytes;
    return Defer([=] { std::memcpy(host, src, bytes); });
  }
  // As a GPU's (common/checksum_cuda.h): hashed where the bytes are and
  // late, at the next Synchronize, so an executor that read the hashes
  // before waiting would report zeros, and one that hashed before the
  // stages ran, stale bytes.
  Status Checksums(const ChecksumPiece* pieces, size_t count, uint64_t* hashes) override {
    ++checksum_batches;
    return Defer([pieces = std::vector<ChecksumPiece>(pieces, pieces + count), hashes] {
      for (size_t i = 0; i < pieces.size(); ++i) hashes[i] = Checksum64(pieces[i].data, pieces[i].bytes);
    });
  }
  // Delta versions: as the GPU's kernels (delta/codec_cuda.h), ordered
  // after everything issued (the staged bytes must be final) and returning
  // once the delta's length is known; the CPU codec does the encoding.
  bool EncodesDeltas() const override { return encodes_deltas; }
  StatusOr<delta::Encoded> EncodeDelta(uint8_t* base, const uint8_t* next, uint64_t size, uint32_t elem_bytes,
                                       uint8_t* out, uint64_t capacity) override {
    for (auto& op : queue_) op();
    queue_.clear();
    ++delta_encodes;
    return delta::EncodeAndAdvance(base, next, size, elem_bytes, out, capacity);
  }
  int synchronizes = 0;
  int delta_encodes = 0;
  bool encodes_deltas = true;
  int checksum_batches = 0;
  int host_allocations = 0;
  uint64_t copied_to_host = 0;
  uint64_t copied_from_host = 0;
  bool claims_device_memory = false;

 private:
  Status Defer(std::function<void()> op) {
    queue_.push_back(std::move(op));
    return Status::Ok();
  }
  std::vector<std::function<void()>> queue_;
  std::vector<bool> quantizes_;  // since the last Synchronize: met a NaN/Inf
  std::map<void*, uint64_t> allocations_;
};

// One trainer rank: its trainer-side export, the agent's view, its engine
// and executor.
struct TrainerRankUnderTest {
  std::unique_ptr<ShardExport> exported;
  std::unique_ptr<ShardView> view;
  std::unique_ptr<DeferredHostDevice> device;  // for the tests of the device path
  std::unique_ptr<transport::Engine> engine;
  std::unique_ptr<GroupFactory> groups;
  std::unique_ptr<PlanExecutor> executor;  // destroyed before the engine
  ~TrainerRankUnderTest() {
    executor.reset();
    engine.reset();
  }
};

class ExecutorTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto f = testing::MakeUpdateFixture(GetParam(), /*exchange=*/true, min_shard_piece_);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    fixture_ = std::move(f).value();
    store_ = MakeInMemoryRendezvousStore();
    for (int r = 0; r < kTrainers; ++r) {
      auto rank = std::make_unique<TrainerRankUnderTest>();
      const std::string name = "/wsync-test-exec-" + std::to_string(getpid()) + "-" + std::to_string(r);
      auto exported = ShardExport::Create(name, fixture_->trainer.ranks[r]);
      ASSERT_TRUE(exported.ok()) << exported.status().ToString();
      rank->exported = std::move(exported).value();
      auto view = ShardView::Open(name, fixture_->trainer.ranks[r]);
      ASSERT_TRUE(view.ok()) << view.status().ToString();
      rank->view = std::move(view).value();
      ASSERT_TRUE(StartEngine(rank.get()).ok());
      ranks_.push_back(std::move(rank));
    }
  }

  Status StartEngine(TrainerRankUnderTest* rank) {
    transport::fabric::LibfabricOptions o;
    o.provider = GetParam();
    o.num_nics = 1;
    o.node = GetParam() == "shm" ? "" : "127.0.0.1";
    o.op_timeout = milliseconds(5000);
    WSYNC_ASSIGN_OR_RETURN(rank->engine, transport::fabric::CreateLibfabricEngine(o));
    return Status::Ok();
  }

  struct Setup {
    ExecutorOptions executor;
    GlooGroupOptions gloo;
  };
  Setup Options(uint64_t watermark, milliseconds gloo_timeout = milliseconds(20000)) {
    Setup o;
    o.executor.watermark_bytes = watermark;
    o.executor.rendezvous_prefix = "test";
    o.executor.write_timeout = milliseconds(20000);
    o.gloo.hostname = "127.0.0.1";
    o.gloo.timeout = gloo_timeout;
    return o;
  }

  StatusOr<std::unique_ptr<PlanExecutor>> Create(int r, TrainerRankPlan plan, const Setup& setup) {
    ranks_[r]->groups = MakeGlooGroupFactory(store_.get(), setup.gloo);
    return PlanExecutor::Create(std::move(plan), ranks_[r]->engine.get(), ranks_[r]->groups.get(), setup.executor);
  }

  Status CreateExecutor(int r, const Setup& setup) {
    WSYNC_ASSIGN_OR_RETURN(ranks_[r]->executor, Create(r, fixture_->plans[r], setup));
    return Status::Ok();
  }
  // The same, with the stages on a DeferredHostDevice of the rank's own.
  Status CreateDeviceExecutor(int r, Setup setup) {
    ranks_[r]->device = std::make_unique<DeferredHostDevice>();
    setup.executor.device = ranks_[r]->device.get();
    return CreateExecutor(r, setup);
  }

  // The trainer side of version v: write every local shard, publish.
  void PublishVersion(uint64_t v, const testing::FullWeights& full) {
    for (int r = 0; r < kTrainers; ++r) {
      for (const TrainerParam& p : fixture_->trainer.ranks[r].params) {
        std::vector<uint8_t> shard = testing::LocalShard(p, full);
        StatusOr<trainer_agent::ShardTensor> t = ranks_[r]->exported->Tensor(p.name);
        ASSERT_TRUE(t.ok());
        ASSERT_EQ(t->bytes, shard.size()) << p.name;
        std::memcpy(t->data, shard.data(), shard.size());
      }
      ASSERT_TRUE(ranks_[r]->exported->Publish(v).ok());
    }
  }

  // Runs version v on the given ranks (threads); returns each rank's result.
  std::vector<StatusOr<VersionReport>> RunRanks(uint64_t v, const std::vector<int>& which,
                                                const DeltaTarget* delta = nullptr) {
    std::vector<std::optional<StatusOr<VersionReport>>> out(kTrainers);
    std::vector<std::thread> threads;
    for (int r : which) {
      threads.emplace_back([&, r] { out[r].emplace(ranks_[r]->executor->Run(v, *ranks_[r]->view, delta)); });
    }
    for (auto& t : threads) t.join();
    std::vector<StatusOr<VersionReport>> results;
    for (int r = 0; r < kTrainers; ++r) {
      results.push_back(out[r] ? std::move(*out[r]) : StatusOr<VersionReport>(Aborted("rank not run")));
    }
    return results;
  }

  // Arms every receiver to count version v's immediates.
  // Without `fill` the receivers keep what they hold (delta versions apply
  // onto it).
  std::vector<std::future<Status>> ExpectVersion(uint64_t v, milliseconds timeout, bool fill = true) {
    std::vector<std::future<Status>> done;
    for (int i = 0; i < kInference; ++i) {
      auto promise = std::make_shared<std::promise<Status>>();
      done.push_back(promise->get_future());
      if (fill) std::fill(fixture_->targets[i].memory.begin(), fixture_->targets[i].memory.end(), testing::kFill);
      Status s = fixture_->targets[i].engine->Expect(
          static_cast<uint32_t>(v), fixture_->expected_arrivals[i],
          [promise](const Status& st) { promise->set_value(st); }, Clock::now() + timeout);
      EXPECT_TRUE(s.ok()) << s.ToString();
      // v's writes reach the receiver's worker over a socket or an shm queue
      // inside libfabric, a path TSan does not follow: to it, their placement
      // was unordered with this thread's fill and last check when the worker
      // placed them before taking the Expect (seen over tcp on a loaded
      // machine). Register runs on that worker, after the Expect: once it
      // returns, the worker has taken both, before any trainer starts.
      uint8_t probe = 0;
      EXPECT_TRUE(fixture_->targets[i].engine->Register(&probe, 1, transport::MemoryKind::kHost, 0).ok());
    }
    return done;
  }

  // After version v failed on the trainer side with no receiver armed for
  // it: writes posted before the failure may still be landing (a write is
  // complete at its sender once delivered, not once placed), so the next
  // ExpectVersion must not refill the targets yet. An expect of v that ends
  // (all of v landed, or its short deadline) is each target's worker saying
  // it has handled what came before it.
  void SettleTargets(uint64_t v) {
    for (int i = 0; i < kInference; ++i) {
      std::promise<Status> settled;
      std::future<Status> outcome = settled.get_future();
      Status s = fixture_->targets[i].engine->Expect(
          static_cast<uint32_t>(v), fixture_->expected_arrivals[i],
          [&settled](const Status& st) { settled.set_value(st); }, Clock::now() + milliseconds(500));
      ASSERT_TRUE(s.ok()) << s.ToString();
      outcome.get().IgnoreError();  // either outcome will do
    }
  }

  // Runs a full update of version v on all ranks and checks every byte.
  // A receiver whose expect of v failed (deadline, error) is not read: v's
  // writes may still be landing in its memory (TSan saw the comparison race
  // with a late write over tcp, after a Gloo timeout on a loaded machine),
  // so its bytes say nothing yet. Callers stop at the first failure for the
  // same reason: the next version's fill would race with those writes too.
  std::vector<VersionReport> UpdateAndVerify(uint64_t v) {
    const testing::FullWeights full = testing::MakeFullWeights(v);
    PublishVersion(v, full);
    auto landed = ExpectVersion(v, milliseconds(30000));
    std::vector<StatusOr<VersionReport>> results = RunRanks(v, {0, 1, 2, 3});
    std::vector<VersionReport> reports;
    for (int r = 0; r < kTrainers; ++r) {
      EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status().ToString();
      if (results[r].ok()) reports.push_back(*results[r]);
      EXPECT_EQ(ranks_[r]->exported->reads_done_version(), v) << "rank " << r;
    }
    for (int i = 0; i < kInference; ++i) {
      Status s = landed[i].get();
      EXPECT_TRUE(s.ok()) << "inference rank " << i << ": " << s.ToString();
      if (!s.ok()) continue;  // writes of v may still land: see above
      const std::vector<uint8_t> want = testing::ExpectedRegion(i, full, fixture_->region_bytes);
      const std::vector<uint8_t>& got = fixture_->targets[i].memory;
      size_t bad = 0, first = 0;
      for (size_t k = 0; k < want.size(); ++k) {
        if (want[k] != got[k] && bad++ == 0) first = k;
      }
      EXPECT_EQ(bad, 0u) << "inference rank " << i << ", version " << v << ": first wrong byte at " << first
                         << " (want " << int(want[first]) << ", got " << int(got[first]) << ")";
    }
    return reports;
  }

  // Version 1 with one non-finite bf16 element (`bits`) in
  // layers.0.q.weight fails on the ranks that quantize it, each naming
  // itself and the tensor, well before a Gloo timeout; version 2 then lands.
  void NonFiniteFailsNamingTheTensorThenTheNextLands(uint16_t bits, bool on_device) {
    for (int r = 0; r < kTrainers; ++r) {
      const Setup setup = Options(64 << 20, milliseconds(60000));
      ASSERT_TRUE((on_device ? CreateDeviceExecutor(r, setup) : CreateExecutor(r, setup)).ok());
    }
    testing::FullWeights bad = testing::MakeFullWeights(1);
    bad.at("layers.0.q.weight")[300] = bits;
    PublishVersion(1, bad);
    const auto t0 = Clock::now();
    std::vector<StatusOr<VersionReport>> results = RunRanks(1, {0, 1, 2, 3});
    EXPECT_LT(Clock::now() - t0, milliseconds(20000));
    int failed = 0;
    for (int r = 0; r < kTrainers; ++r) {
      if (results[r].ok()) continue;
      ++failed;
      const std::string& m = results[r].status().message();
      EXPECT_NE(m.find("tensor 'layers.0.q.weight'"), std::string::npos) << m;
      EXPECT_NE(m.find("trainer rank " + std::to_string(r)), std::string::npos) << m;
      EXPECT_NE(m.find(bits == 0x7F80 ? "infinite" : "NaN"), std::string::npos) << m;
    }
    EXPECT_GT(failed, 0);
    SettleTargets(1);
    UpdateAndVerify(2);
  }

  // Three updates land bit for bit, each rank receiving from its peers
  // exactly what its plan says, counted here from the rank plans apart from
  // the executor.
  void ThreeUpdatesLandBitForBit() {
    for (int r = 0; r < kTrainers; ++r) ASSERT_TRUE(CreateExecutor(r, Options(64 << 20)).ok());
    uint64_t plan_bytes = 0;
    for (const TrainerRankPlan& p : fixture_->plans) plan_bytes += p.write_bytes;
    // What each rank must receive from its peers: in a planned exchange its
    // rows from each peer, times the bytes of one row of what it holds (of
    // every expert of a stack); in an all-gather everything it holds but its
    // shard.
    std::vector<uint64_t> from_peers(kTrainers, 0);
    uint64_t exchange_pieces = 0, stacked_pieces = 0;
    for (int r = 0; r < kTrainers; ++r) {
      for (const RankMeshGroup& g : fixture_->plans[r].groups) {
        for (const RankSource& s : g.sources) {
          const uint64_t esize = DTypeSize(s.dtype);
          if (!s.exchange()) {
            if (s.gather_dim >= 0)
              from_peers[r] += esize * static_cast<uint64_t>(s.held.NumElements() - s.local.NumElements());
            continue;
          }
          uint64_t row = esize;
          for (int d = 0; d < s.held.ndim; ++d)
            if (d != s.gather_dim) row *= static_cast<uint64_t>(s.held.size[d]);
          stacked_pieces += s.held.size[0] > 1 && s.gather_dim > 0;
          for (size_t i = 0; i < s.gather_ranks.size(); ++i) {
            if (s.gather_ranks[i] == r) continue;
            from_peers[r] += row * static_cast<uint64_t>(s.recv_rows[i].size);
            exchange_pieces += s.recv_rows[i].size > 0;
          }
        }
      }
    }
    // The fixture's fp8 tensors have 128-row blocks across FSDP shard edges:
    // the update must exercise the exchange, of stacked experts too.
    ASSERT_GT(exchange_pieces, 0u);
    ASSERT_GT(stacked_pieces, 0u);
    for (uint64_t v = 1; v <= 3; ++v) {
      std::vector<VersionReport> reports = UpdateAndVerify(v);
      if (HasFailure()) return;  // v's writes may still be landing (UpdateAndVerify)
      ASSERT_EQ(reports.size(), static_cast<size_t>(kTrainers));
      uint64_t written = 0;
      for (int r = 0; r < kTrainers; ++r) {
        const VersionReport& rep = reports[r];
        written += rep.written_bytes;
        EXPECT_EQ(rep.writes, fixture_->plans[r].writes);
        EXPECT_EQ(rep.exchanged_bytes, from_peers[r]) << "rank " << r;
        EXPECT_LE(rep.peak_temp_bytes, rep.watermark_bytes);
        EXPECT_GT(rep.peak_temp_bytes, 0u);
        std::fprintf(stderr, "[rank %d] %s\n", r, rep.Summary().c_str());
      }
      EXPECT_EQ(written, plan_bytes);
    }
  }

  // Delta versions: an inbox (delta/inbox.h) beside each receiver's region,
  // registered with its engine and published in every plan as an inference
  // agent with InferenceAgentOptions::deltas does.
  struct Inbox {
    std::vector<uint8_t> memory;
    std::unique_ptr<transport::MemoryRegion> region;
  };
  void AddInboxes() {
    for (int i = 0; i < kInference; ++i) {
      Inbox inbox;
      inbox.memory.assign(delta::InboxBytes(fixture_->region_bytes), 0);
      auto mr = fixture_->targets[i].engine->Register(inbox.memory.data(), inbox.memory.size());
      ASSERT_TRUE(mr.ok()) << mr.status().ToString();
      inbox.region = std::move(mr).value();
      for (TrainerRankPlan& plan : fixture_->plans) {
        for (InferencePeer& peer : plan.peers) {
          if (peer.rank == i) peer.region_descriptors[delta::InboxRegionId("weights")] = inbox.region->descriptor().ToText();
        }
      }
      inboxes_.push_back(std::move(inbox));
    }
  }
  // What a receiver does at commit (InferenceAgent::ApplyDeltas): every
  // write's slot stamped with v, applied by the CPU codec onto what it held
  // (base). Returns the deltas applied.
  uint64_t ApplyDeltas(int i, uint64_t v, uint64_t base) {
    uint64_t applied = 0;
    for (TrainerRankPlan plan : fixture_->plans) {
      ExpandPlanes(&plan);
      for (const RankMeshGroup& g : plan.groups) {
        for (const RankSource& src : g.sources) {
          for (const RankWrite& w : src.writes) {
            if (w.dst_rank != i) continue;
            const delta::Slot slot = delta::SlotOf(w.region_offset, w.bytes);
            if (slot.bytes < delta::kSlotHeaderBytes) continue;
            const uint8_t* at = inboxes_[i].memory.data() + slot.at;
            delta::SlotHeader h;
            if (!delta::ReadSlotHeader(at, &h) || h.version != v) continue;  // came whole
            EXPECT_EQ(h.base, base) << w.dst_name;
            EXPECT_LE(h.delta_bytes, slot.bytes - delta::kSlotHeaderBytes) << w.dst_name;
            Status s = delta::Apply(at + delta::kSlotHeaderBytes, h.delta_bytes,
                                    fixture_->targets[i].memory.data() + w.region_offset, w.bytes, w.dst_name.c_str());
            EXPECT_TRUE(s.ok()) << s.ToString();
            ++applied;
          }
        }
      }
    }
    return applied;
  }

  uint64_t min_shard_piece_ = 0;  // PlanOptions::min_shard_piece_bytes
  std::unique_ptr<testing::UpdateFixture> fixture_;
  std::unique_ptr<RendezvousStore> store_;
  std::vector<std::unique_ptr<TrainerRankUnderTest>> ranks_;
  std::vector<Inbox> inboxes_;

  void TearDown() override {
    ranks_.clear();  // executors and engines before the receivers
    inboxes_.clear();
    fixture_.reset();
  }
};

TEST_P(ExecutorTest, ThreeUpdatesLandBitForBit) { ThreeUpdatesLandBitForBit(); }

// A watermark equal to the largest single source: sources must wait for the
// writes of earlier ones, temporary memory never exceeds it, bytes still right.
TEST_P(ExecutorTest, SmallWatermarkBindsAndIsNeverExceeded) {
  uint64_t watermark = 0;
  for (int r = 0; r < kTrainers; ++r) {
    { Status s = CreateExecutor(r, Options(64 << 20)); ASSERT_TRUE(s.ok()) << s.ToString(); }
    watermark = std::max(watermark, ranks_[r]->executor->max_source_need());
  }
  for (int r = 0; r < kTrainers; ++r) {
    ranks_[r]->executor.reset();
    ASSERT_TRUE(CreateExecutor(r, Options(watermark)).ok());
    EXPECT_LE(ranks_[r]->executor->arena_bytes(), watermark);
  }
  // Whether a source has to wait depends on whether the previous one's
  // writes completed first, a race the engine wins on a quiet machine, so
  // waits are printed, not asserted. What is deterministic: the watermark is
  // exactly the largest source's need, so the rank holding that source runs
  // right at the bound, and no rank ever goes above it.
  for (uint64_t v = 1; v <= 2; ++v) {
    uint64_t max_peak = 0;
    for (const VersionReport& rep : UpdateAndVerify(v)) {
      EXPECT_LE(rep.peak_temp_bytes, watermark);
      max_peak = std::max(max_peak, rep.peak_temp_bytes);
      std::fprintf(stderr, "%s\n", rep.Summary().c_str());
    }
    if (HasFailure()) return;  // v's writes may still be landing (UpdateAndVerify)
    EXPECT_EQ(max_peak, watermark) << "the watermark should bind on the rank with the largest source";
  }
}

TEST_P(ExecutorTest, SourceAboveWatermarkIsRefusedBeforeAnythingStarts) {
  StatusOr<std::unique_ptr<PlanExecutor>> e =
      Create(0, fixture_->plans[0], Options(4096));
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  const std::string& m = e.status().message();
  EXPECT_NE(m.find("trainer rank 0"), std::string::npos) << m;
  EXPECT_NE(m.find("tensor '"), std::string::npos) << m;
  EXPECT_NE(m.find("watermark of 4096"), std::string::npos) << m;
  EXPECT_EQ(ranks_[0]->exported->reads_done_version(), 0u);
}

TEST_P(ExecutorTest, BadBoxIsRefusedNamingTheTensor) {
  TrainerRankPlan plan = fixture_->plans[1];
  RankWrite* victim = nullptr;
  for (RankMeshGroup& g : plan.groups) {
    for (RankSource& s : g.sources) {
      if (!s.writes.empty() && victim == nullptr) victim = &s.writes[0];
    }
  }
  ASSERT_NE(victim, nullptr);
  victim->src_box.offset[0] += 100000;
  StatusOr<std::unique_ptr<PlanExecutor>> e =
      Create(1, plan, Options(64 << 20));
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("outside what the rank holds"), std::string::npos) << e.status().message();
  EXPECT_NE(e.status().message().find("trainer rank 1"), std::string::npos) << e.status().message();
}

// Rank 3 never joins version 1: the others fail within the Gloo timeout with
// an error naming themselves, not a hang, and report nothing as read. Then
// rank 3 "restarts" (a fresh executor) and version 2 succeeds everywhere:
// the groups were rebuilt under a new generation.
TEST_P(ExecutorTest, MissingPeerFailsWithinTimeoutThenRecovers) {
  const milliseconds timeout(3000);
  for (int r = 0; r < kTrainers; ++r) ASSERT_TRUE(CreateExecutor(r, Options(64 << 20, timeout)).ok());
  PublishVersion(1, testing::MakeFullWeights(1));
  const auto t0 = Clock::now();
  std::vector<StatusOr<VersionReport>> results = RunRanks(1, {0, 1, 2});
  const auto took = Clock::now() - t0;
  EXPECT_LT(took, timeout * 3) << "a missing peer must end in an error within the Gloo timeout";
  for (int r = 0; r < 3; ++r) {
    ASSERT_FALSE(results[r].ok()) << "rank " << r;
    const std::string& m = results[r].status().message();
    EXPECT_NE(m.find("trainer rank " + std::to_string(r)), std::string::npos) << m;
    EXPECT_NE(m.find("mesh group '"), std::string::npos) << m;
    EXPECT_EQ(ranks_[r]->exported->reads_done_version(), 0u);
    std::fprintf(stderr, "rank %d: %s\n", r, results[r].status().ToString().c_str());
  }
  ranks_[3]->executor.reset();
  ASSERT_TRUE(CreateExecutor(3, Options(64 << 20, timeout)).ok());
  UpdateAndVerify(2);
}

// A trainer that diverged (a NaN in q) fails the version on every rank that
// quantizes q, naming the tensor, while the collectives still run to the
// end: nobody waits for a Gloo timeout, and the next version (finite again)
// lands bit for bit on the same groups.
TEST_P(ExecutorTest, NonFiniteWeightFailsTheVersionThenTheNextOneLands) {
  NonFiniteFailsNamingTheTensorThenTheNextLands(0x7FC0 /* bf16 NaN */, /*on_device=*/false);
}

// The device path: stages issued asynchronously, sources waiting for one
// device wait between them, writes posted only once it returned. Every
// byte lands, as on the host, and the memory bound still holds.
TEST_P(ExecutorTest, DeviceStagesThatRunLateStillLandBitForBit) {
  for (int r = 0; r < kTrainers; ++r) ASSERT_TRUE(CreateDeviceExecutor(r, Options(64 << 20)).ok());
  for (uint64_t v = 1; v <= 2; ++v) {
    for (const VersionReport& rep : UpdateAndVerify(v)) {
      EXPECT_LE(rep.peak_temp_bytes, rep.watermark_bytes);
      std::fprintf(stderr, "%s\n", rep.Summary().c_str());
    }
    if (HasFailure()) return;
  }
  for (int r = 0; r < kTrainers; ++r) EXPECT_GT(ranks_[r]->device->synchronizes, 0) << "rank " << r;
}

// Delta versions (ExecutorOptions::deltas) on the host and on the device
// path (also staged through host memory): versions after the first change
// about 1 element in 40 and their writes go as deltas into the receivers'
// inbox slots, which the test applies as a receiver does at commit; every
// byte must then be the reference's (computed from the full weights, never
// from a delta). On the deferred device the copies are its memory, and an
// encode or a header written before its stages ran would send stale bytes.
TEST_P(ExecutorTest, DeltaVersionsLandBitForBit) {
  AddInboxes();
  if (HasFailure()) return;
  // The first version's weights with elements i % 40 == v % 40 nudged.
  auto drifted = [](uint64_t v) {
    testing::FullWeights full = testing::MakeFullWeights(1);
    for (auto& [name, values] : full) {
      for (size_t i = v % 40; i < values.size(); i += 40) values[i] ^= 0x0003;
    }
    return full;
  };
  uint64_t v = 0;
  for (const char* mode : {"host", "device", "device, host staging"}) {
    SCOPED_TRACE(mode);
    const bool on_device = std::string(mode) != "host";
    Setup setup = Options(64 << 20);
    setup.executor.deltas = true;
    // Host staging: the engine sends the mirror, so a delta not copied
    // there would send the mirror's filler.
    setup.executor.stage_through_host = std::string(mode) == "device, host staging";
    for (int r = 0; r < kTrainers; ++r) {
      ASSERT_TRUE((on_device ? CreateDeviceExecutor(r, setup) : CreateExecutor(r, setup)).ok());
      EXPECT_GT(ranks_[r]->executor->delta_copy_bytes(), 0u) << "rank " << r;
    }
    // The first version of each executor goes whole: it holds no copies yet.
    for (int k = 0; k < 3; ++k) {
      ++v;
      const testing::FullWeights full = drifted(v);
      PublishVersion(v, full);
      auto landed = ExpectVersion(v, milliseconds(30000), /*fill=*/k == 0);
      const DeltaTarget target{v - 1, {0, 1}};
      std::vector<StatusOr<VersionReport>> results = RunRanks(v, {0, 1, 2, 3}, k == 0 ? nullptr : &target);
      uint64_t deltas = 0, written = 0, whole = 0;
      for (int r = 0; r < kTrainers; ++r) {
        ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status().ToString();
        deltas += results[r]->delta_writes;
        written += results[r]->written_bytes;
        whole += results[r]->write_bytes;
        EXPECT_GT(results[r]->delta_copy_bytes, 0u);
        if (k > 0) std::fprintf(stderr, "[rank %d] %s\n", r, results[r]->Summary().c_str());
      }
      uint64_t applied = 0;
      for (int i = 0; i < kInference; ++i) {
        Status s = landed[i].get();
        ASSERT_TRUE(s.ok()) << "inference rank " << i << ": " << s.ToString();
        applied += ApplyDeltas(i, v, v - 1);
        const std::vector<uint8_t> want = testing::ExpectedRegion(i, full, fixture_->region_bytes);
        const std::vector<uint8_t>& got = fixture_->targets[i].memory;
        size_t bad = 0, first = 0;
        for (size_t b = 0; b < want.size(); ++b) {
          if (want[b] != got[b] && bad++ == 0) first = b;
        }
        ASSERT_EQ(bad, 0u) << "inference rank " << i << ", version " << v << ": first wrong byte at " << first;
      }
      EXPECT_EQ(applied, deltas) << "version " << v;
      if (k == 0) {
        EXPECT_EQ(deltas, 0u);
      } else {
        EXPECT_GT(deltas, 0u) << "version " << v;
        EXPECT_LT(written, whole / 2) << "version " << v;
      }
    }
    if (on_device) {
      for (int r = 0; r < kTrainers; ++r) EXPECT_GT(ranks_[r]->device->delta_encodes, 0) << "rank " << r;
    }
    for (auto& rank : ranks_) rank->executor.reset();
  }
}

// A device that cannot encode deltas sends every write whole and keeps no
// copies, with deltas asked for.
TEST_P(ExecutorTest, DeltasOnADeviceWithoutTheEncodeGoWhole) {
  AddInboxes();
  if (HasFailure()) return;
  Setup setup = Options(64 << 20);
  setup.executor.deltas = true;
  for (int r = 0; r < kTrainers; ++r) {
    ranks_[r]->device = std::make_unique<DeferredHostDevice>();
    ranks_[r]->device->encodes_deltas = false;
    setup.executor.device = ranks_[r]->device.get();
    ASSERT_TRUE(CreateExecutor(r, setup).ok());
    EXPECT_EQ(ranks_[r]->executor->delta_copy_bytes(), 0u);
  }
  for (const VersionReport& rep : UpdateAndVerify(1)) EXPECT_EQ(rep.delta_writes, 0u);
}

// Checksums (ExecutorOptions::checksums): one per write posted, of the
// bytes the receiver then holds at that place. On the deferred device they
// must be taken after the device ran the stages, not of stale staging.
TEST_P(ExecutorTest, ChecksumsAreOfTheBytesThatLand) {
  for (bool on_device : {false, true}) {
    SCOPED_TRACE(on_device ? "device" : "host");
    Setup setup = Options(64 << 20);
    setup.executor.checksums = true;
    for (int r = 0; r < kTrainers; ++r) ASSERT_TRUE((on_device ? CreateDeviceExecutor(r, setup) : CreateExecutor(r, setup)).ok());
    const uint64_t v = on_device ? 2 : 1;
    std::vector<VersionReport> reports = UpdateAndVerify(v);
    if (HasFailure()) return;
    size_t checked = 0;
    for (const VersionReport& rep : reports) {
      EXPECT_EQ(rep.checksums.size(), rep.writes);
      EXPECT_GT(rep.seconds.checksum, 0.0);
      for (const WriteChecksum& c : rep.checksums) {
        const std::vector<uint8_t>& landed = fixture_->targets[c.dst_rank].memory;
        ASSERT_LE(c.offset + c.bytes, landed.size());
        EXPECT_EQ(Checksum64(landed.data() + c.offset, c.bytes), c.hash)
            << "inference rank " << c.dst_rank << " region '" << c.region << "' offset " << c.offset;
        ++checked;
      }
    }
    EXPECT_GT(checked, 0u);
    if (on_device) {
      for (int r = 0; r < kTrainers; ++r) EXPECT_GT(ranks_[r]->device->checksum_batches, 0) << "rank " << r;
    }
    for (auto& rank : ranks_) rank->executor.reset();
  }
}

// Host staging (an engine that cannot register device memory): the writes
// leave from a pinned host mirror of the device arena, filled by copies
// that run late like every device stage. A write sent from the arena, or
// before its copy ran, would land the mirror's filler; every byte must land
// as on the host, and the checksums must be of the bytes that landed.
TEST_P(ExecutorTest, HostStagedWritesLandBitForBit) {
  Setup setup = Options(64 << 20);
  setup.executor.stage_through_host = true;
  setup.executor.checksums = true;
  for (int r = 0; r < kTrainers; ++r) ASSERT_TRUE(CreateDeviceExecutor(r, setup).ok());
  for (uint64_t v = 1; v <= 2; ++v) {
    std::vector<VersionReport> reports = UpdateAndVerify(v);
    if (HasFailure()) return;
    uint64_t written = 0;
    for (const VersionReport& rep : reports) {
      EXPECT_EQ(rep.staged_bytes, rep.written_bytes);
      EXPECT_NE(rep.Summary().find("staged through pinned host memory"), std::string::npos) << rep.Summary();
      written += rep.written_bytes;
      for (const WriteChecksum& c : rep.checksums) {
        const std::vector<uint8_t>& landed = fixture_->targets[c.dst_rank].memory;
        ASSERT_LE(c.offset + c.bytes, landed.size());
        EXPECT_EQ(Checksum64(landed.data() + c.offset, c.bytes), c.hash)
            << "inference rank " << c.dst_rank << " region '" << c.region << "' offset " << c.offset;
      }
    }
    EXPECT_GT(written, 0u);
  }
  for (int r = 0; r < kTrainers; ++r) EXPECT_EQ(ranks_[r]->device->host_allocations, 1) << "rank " << r;
}

// The GPU sidecar's collectives (pipeline/staged_group.h): the arena is
// device memory, so every all-gather and exchange on it goes through host
// memory (each rank's device counts what came back in), while the version
// check (host memory) passes straight through. The deferred device runs its
// stages late, so a shard read back before its copy ran would land wrong.
TEST_P(ExecutorTest, CollectivesThroughHostMemoryOnADeviceLandBitForBit) {
  Setup setup = Options(64 << 20);
  for (int r = 0; r < kTrainers; ++r) {
    ranks_[r]->device = std::make_unique<DeferredHostDevice>();
    ranks_[r]->device->claims_device_memory = true;
    setup.executor.device = ranks_[r]->device.get();
    ranks_[r]->groups = MakeHostStagedGroupFactory(MakeGlooGroupFactory(store_.get(), setup.gloo),
                                                   ranks_[r]->device.get());
    StatusOr<std::unique_ptr<PlanExecutor>> e = PlanExecutor::Create(
        fixture_->plans[r], ranks_[r]->engine.get(), ranks_[r]->groups.get(), setup.executor);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    ranks_[r]->executor = std::move(e).value();
  }
  for (uint64_t v = 1; v <= 2; ++v) {
    std::vector<VersionReport> reports = UpdateAndVerify(v);
    if (HasFailure()) return;
    uint64_t exchanged = 0;
    for (const VersionReport& rep : reports) exchanged += rep.exchanged_bytes;
    EXPECT_GT(exchanged, 0u) << "the fixture's plan must gather or exchange something";
  }
  for (int r = 0; r < kTrainers; ++r) EXPECT_GT(ranks_[r]->device->copied_from_host, 0u) << "rank " << r;
}

TEST_P(ExecutorTest, HostStagingWithoutADeviceIsRefused) {
  Setup setup = Options(64 << 20);
  setup.executor.stage_through_host = true;
  StatusOr<std::unique_ptr<PlanExecutor>> e = Create(0, fixture_->plans[0], setup);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("host staging"), std::string::npos) << e.status().ToString();
}

// The same among sources that share one device wait: each quantize has
// its own flag, so the error still names the tensor.
TEST_P(ExecutorTest, NonFiniteWeightOnADeviceIsPinnedOnItsTensor) {
  NonFiniteFailsNamingTheTensorThenTheNextLands(0x7F80 /* bf16 +Inf */, /*on_device=*/true);
}

// A trainer rank's shards as plain vectors, for hand-made plans.
class VectorShards : public ShardSource {
 public:
  std::map<std::string, std::vector<uint16_t>> tensors;
  uint64_t reads_done = 0;
  const uint8_t* Shard(const std::string& name, uint64_t* bytes) const override {
    auto it = tensors.find(name);
    if (it == tensors.end()) return nullptr;
    *bytes = it->second.size() * 2;
    return reinterpret_cast<const uint8_t*>(it->second.data());
  }
  void ReadsDone(uint64_t version) override { reads_done = version; }
};

// A source that gathers nothing and writes only fp8 (a replicated or EP-only
// weight) is quantized straight from the trainer's shard: no held copy in
// its temporary memory on the host, and on a device that cannot reach the
// shard, a copy first. Its row block goes out unpacked, its column block
// packed; every byte equals the fp8 reference cut by plain loops.
TEST_P(ExecutorTest, AnUngatheredFp8SourceIsQuantizedFromTheShardItself) {
  constexpr int64_t kRows = 256, kCols = 384;
  RankSource src;
  src.name = "replicated.w";
  src.global_shape = {kRows, kCols};
  src.local = src.held = Box{2, {0, 0}, {kRows, kCols}};
  src.gather_ranks = {0};
  auto write = [&](WriteKind kind, Box box, uint64_t offset) {
    RankWrite w;
    w.dst_rank = 0;
    w.kind = kind;
    w.dst_dtype = kind == WriteKind::kScale ? DType::kFP32 : DType::kFP8E4M3;
    w.src_box = box;
    w.region = "weights";
    w.region_offset = offset;
    w.bytes = static_cast<uint64_t>(box.NumElements()) * (kind == WriteKind::kScale ? 4 : 1);
    w.dst_name = "replicated.w";
    src.writes.push_back(w);
  };
  write(WriteKind::kWeight, Box{2, {0, 0}, {128, kCols}}, 0);                // rows: one run
  write(WriteKind::kWeight, Box{2, {128, 128}, {128, 256}}, 128 * kCols);     // a column block: packed
  write(WriteKind::kScale, Box{2, {0, 0}, {2, 3}}, 160 * 1024);               // the whole grid
  write(WriteKind::kScale, Box{2, {0, 1}, {2, 2}}, 160 * 1024 + 64);          // its last two columns
  TrainerRankPlan plan;
  plan.rank = 0;
  plan.world = 1;
  plan.groups = {RankMeshGroup{"solo", {0}, {src}}};
  for (const InferencePeer& p : fixture_->plans[0].peers) {
    if (p.rank == 0) plan.peers.push_back(p);
  }
  ASSERT_EQ(plan.peers.size(), 1u);
  uint32_t arrivals = 0;
  for (const RankWrite& w : src.writes) arrivals += ranks_[0]->engine->ArrivalsPerWrite(w.bytes);

  for (const bool on_device : {false, true}) {
    SCOPED_TRACE(on_device ? "on a device that cannot read the shard" : "on the host");
    const uint64_t v = on_device ? 2 : 1;
    VectorShards shards;
    std::vector<uint16_t>& x = shards.tensors[src.name];
    x.resize(kRows * kCols);
    uint32_t state = 77 + static_cast<uint32_t>(v);
    for (size_t i = 0; i < x.size(); ++i) {
      state = state * 1664525u + 1013904223u;
      x[i] = static_cast<uint16_t>(((state >> 16) & 0x8000) | (0x3800 + (i / 128 % 7) * 0x80 + (state >> 9) % 0x80));
    }
    Setup setup = Options(64 << 20);
    if (on_device) {
      ranks_[0]->device = std::make_unique<DeferredHostDevice>();
      setup.executor.device = ranks_[0]->device.get();
    }
    ranks_[0]->groups = MakeGlooGroupFactory(store_.get(), setup.gloo);
    StatusOr<std::unique_ptr<PlanExecutor>> e =
        PlanExecutor::Create(plan, ranks_[0]->engine.get(), ranks_[0]->groups.get(), setup.executor);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    if (!on_device) {
      EXPECT_LT((*e)->max_source_need(), static_cast<uint64_t>(kRows * kCols * 2))
          << "no room for a held bf16 copy is needed";
    }
    std::vector<uint8_t>& memory = fixture_->targets[0].memory;
    std::fill(memory.begin(), memory.end(), testing::kFill);
    std::promise<Status> landed;
    ASSERT_TRUE(fixture_->targets[0]
                    .engine->Expect(static_cast<uint32_t>(v), arrivals, [&](const Status& st) { landed.set_value(st); },
                                    Clock::now() + milliseconds(20000))
                    .ok());
    StatusOr<VersionReport> r = (*e)->Run(v, shards);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(landed.get_future().get().ok());
    EXPECT_EQ(shards.reads_done, v);
    e->reset();

    StatusOr<Fp8BlockTensor> want = QuantizeFp8Blocks({x.data(), kRows, kCols, kCols});
    ASSERT_TRUE(want.ok());
    for (int64_t row = 0; row < kRows; ++row) {
      for (int64_t c = 0; c < kCols; ++c) {
        const uint8_t q = want->q[row * kCols + c];
        if (row < 128) {
          ASSERT_EQ(memory[row * kCols + c], q) << row << "," << c;
        }
        if (row >= 128 && c >= 128) {
          ASSERT_EQ(memory[128 * kCols + (row - 128) * 256 + (c - 128)], q) << row << "," << c;
        }
      }
    }
    float scales[6], last_two[4];
    std::memcpy(scales, memory.data() + 160 * 1024, sizeof scales);
    std::memcpy(last_two, memory.data() + 160 * 1024 + 64, sizeof last_two);
    for (int i = 0; i < 6; ++i) EXPECT_EQ(scales[i], want->scale_inv[i]) << i;
    for (int i = 0; i < 4; ++i) EXPECT_EQ(last_two[i], want->scale_inv[(i / 2) * 3 + 1 + i % 2]) << i;
  }
}

// Inference rank 1 goes away before the update: every trainer rank that
// writes to it fails the version with an error naming itself, the tensor and
// the receiver, within the transport's operation timeout; the others finish
// (collectives are not abandoned by a rank whose writes failed), so nobody
// waits for a Gloo timeout. Nothing is reported done by a failing rank.
TEST_P(ExecutorTest, DeadReceiverFailsTheWritersNamingIt) {
  // libfabric 1.17's shm provider crashes (SIGSEGV in its progress path) when
  // a peer endpoint of the same process is closed under it; a dead receiver
  // is a network matter anyway, exercised over tcp.
  if (GetParam() == "shm") GTEST_SKIP() << "needs a network provider";
  for (int r = 0; r < kTrainers; ++r) ASSERT_TRUE(CreateExecutor(r, Options(64 << 20, milliseconds(60000))).ok());
  fixture_->targets[1].region.reset();
  fixture_->targets[1].engine.reset();
  PublishVersion(1, testing::MakeFullWeights(1));
  const auto t0 = Clock::now();
  std::vector<StatusOr<VersionReport>> results = RunRanks(1, {0, 1, 2, 3});
  EXPECT_LT(Clock::now() - t0, milliseconds(30000));
  int failed = 0;
  for (int r = 0; r < kTrainers; ++r) {
    bool writes_to_1 = false;
    for (const RankMeshGroup& g : fixture_->plans[r].groups) {
      for (const RankSource& s : g.sources) {
        for (const RankWrite& w : s.writes) writes_to_1 |= w.dst_rank == 1;
      }
    }
    if (!writes_to_1) {
      EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status().ToString();
      continue;
    }
    ++failed;
    ASSERT_FALSE(results[r].ok()) << "rank " << r;
    const std::string& m = results[r].status().message();
    EXPECT_NE(m.find("trainer rank " + std::to_string(r)), std::string::npos) << m;
    EXPECT_NE(m.find("write to inference rank 1"), std::string::npos) << m;
    EXPECT_NE(m.find("tensor '"), std::string::npos) << m;
    std::fprintf(stderr, "rank %d: %s\n", r, results[r].status().ToString().c_str());
  }
  EXPECT_GT(failed, 0);
}

// The planner's default minimum piece: small tensors stay whole, so their
// writers receive the rest of them. The row-parallel o.weight's two column
// halves are written by two ranks that receive only their half of each row
// (RankSource::send_cols), and norm.weight, which both inference ranks hold
// whole, by one rank that receives it once and writes both copies.
class ExecutorUncutTest : public ExecutorTest {
 protected:
  ExecutorUncutTest() { min_shard_piece_ = PlanOptions{}.min_shard_piece_bytes; }
};

TEST_P(ExecutorUncutTest, NarrowedAndSharedPiecesLandBitForBit) {
  bool narrowed = false;
  std::set<int32_t> norm_writers;
  for (const TrainerRankPlan& plan : fixture_->plans) {
    for (const RankMeshGroup& g : plan.groups) {
      for (const RankSource& s : g.sources) {
        if (s.name == "layers.0.o.weight" && s.exchange() && !s.writes.empty()) {
          narrowed = narrowed || !s.send_cols.empty();
          EXPECT_EQ(s.held.size[1], 128) << "rank " << plan.rank << " holds " << BoxText(s.held);
        }
        if (s.name == "norm.weight" && !s.writes.empty()) norm_writers.insert(plan.rank);
      }
    }
  }
  EXPECT_TRUE(narrowed);
  EXPECT_EQ(norm_writers.size(), 1u);
  ThreeUpdatesLandBitForBit();
}

// A narrowed piece that reaches past the shard's columns is refused before
// anything runs, naming the tensor, the peer and the columns.
TEST_P(ExecutorUncutTest, NarrowedPieceOutsideTheShardIsRefused) {
  for (int32_t r = 0; r < kTrainers; ++r) {
    TrainerRankPlan plan = fixture_->plans[r];
    for (RankMeshGroup& g : plan.groups) {
      for (RankSource& s : g.sources) {
        if (s.send_cols.empty()) continue;
        for (size_t i = 0; i < s.send_cols.size(); ++i) {
          if (s.send_rows[i].size == 0 || s.gather_ranks[i] == r) continue;
          s.send_cols[i].offset += 200;  // past the 256 columns
          StatusOr<std::unique_ptr<PlanExecutor>> e = Create(r, plan, Options(64 << 20));
          ASSERT_FALSE(e.ok());
          EXPECT_NE(e.status().message().find("piece for rank " + std::to_string(s.gather_ranks[i])), std::string::npos)
              << e.status().message();
          EXPECT_NE(e.status().message().find("is outside the local shard"), std::string::npos) << e.status().message();
          EXPECT_NE(e.status().message().find(s.name), std::string::npos) << e.status().message();
          return;
        }
      }
    }
  }
  FAIL() << "no rank sends a narrowed piece to a peer";
}

INSTANTIATE_TEST_SUITE_P(Providers, ExecutorUncutTest, ::testing::Values("shm", "tcp;ofi_rxm"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "shm" ? std::string("shm") : std::string("tcp");
                         });

INSTANTIATE_TEST_SUITE_P(Providers, ExecutorTest, ::testing::Values("shm", "tcp;ofi_rxm"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "shm" ? std::string("shm") : std::string("tcp");
                         });

}  // namespace
}  // namespace wsync
