#include "inference_agent/agent.h"

#include <algorithm>
#include <map>

#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <tuple>
#include <utility>

#include <sys/mman.h>

#include "delta/codec.h"
#include "delta/inbox.h"
#include "inference_agent/descriptor_text.h"

namespace wsync::inference {
namespace {

// Outcomes kept for WaitVersion / idempotent BeginVersion; versions are
// started in order, so older ones are never asked about again.
constexpr size_t kKeptVersions = 1024;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string Fixed3(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f", x);
  return buf;
}

}  // namespace

// One weight region's inbox, registered: private anonymous memory beside a
// host region, or memory of a device region's owner on its device
// (WeightMemory::AllocateInbox), read and applied through it.
struct InferenceAgent::Inbox {
  uint8_t* data = nullptr;
  uint64_t bytes = 0;
  WeightMemory::Region region;        // the inbox as a region (for WeightMemory::Read)
  const WeightMemory::Region* of = nullptr;  // the landing region it serves
  WeightMemory* owner = nullptr;      // device memory: whose it is; null: mapped here
  Inbox() = default;
  Inbox(const Inbox&) = delete;
  Inbox& operator=(const Inbox&) = delete;
  ~Inbox() {
    if (data == nullptr) return;
    if (owner != nullptr) owner->FreeInbox(*of, data);
    else munmap(data, bytes);
  }
};

InferenceAgent::InferenceAgent(std::unique_ptr<transport::Engine> engine, std::unique_ptr<WeightMemory> memory,
                               InferenceRank rank, InferenceAgentOptions options)
    : options_(std::move(options)),
      rank_(std::move(rank)),
      memory_(std::move(memory)),
      landed_base_(kNoVersion),
      engine_(std::move(engine)) {}

InferenceAgent::~InferenceAgent() {
  regions_.clear();
  engine_.reset();
}

StatusOr<std::unique_ptr<InferenceAgent>> InferenceAgent::Create(std::unique_ptr<transport::Engine> engine,
                                                                 WeightStore store, InferenceRank rank,
                                                                 InferenceAgentOptions options) {
  return Create(std::move(engine), MakeShmWeightMemory(std::move(store)), std::move(rank), std::move(options));
}

StatusOr<std::unique_ptr<InferenceAgent>> InferenceAgent::Create(std::unique_ptr<transport::Engine> engine,
                                                                 std::unique_ptr<WeightMemory> memory,
                                                                 InferenceRank rank, InferenceAgentOptions options) {
  const std::string where = "inference rank " + std::to_string(rank.rank);
  if (engine == nullptr) return InvalidArgument(where + ": no transport engine");
  if (memory == nullptr) return InvalidArgument(where + ": no weight memory");
  if (memory->regions().size() != rank.regions.size()) {
    return InvalidArgument(where + ": weight memory '" + memory->name() + "' has " +
                           std::to_string(memory->regions().size()) + " regions, the layout " +
                           std::to_string(rank.regions.size()));
  }
  if (options.deltas) options.hold = true;
  if (options.shadow != nullptr) {
    options.hold = true;
    const auto& live = memory->regions();
    const auto& shadow = options.shadow->regions();
    bool same = live.size() == shadow.size();
    for (size_t i = 0; same && i < live.size(); ++i)
      same = live[i].id == shadow[i].id && live[i].size == shadow[i].size &&
             (live[i].kind == shadow[i].kind || shadow[i].kind == transport::MemoryKind::kHost);
    if (!same) return InvalidArgument(where + ": the shadow memory's regions differ from '" + memory->name() + "'");
  }
  std::unique_ptr<InferenceAgent> agent(
      new InferenceAgent(std::move(engine), std::move(memory), std::move(rank), std::move(options)));
  // In shadow mode the writes land in the shadow: it is what is registered.
  const std::vector<WeightMemory::Region>& landing =
      agent->options_.shadow ? agent->options_.shadow->regions() : agent->memory_->regions();
  for (size_t i = 0; i < agent->rank_.regions.size(); ++i) {
    const WeightMemory::Region& r = landing[i];
    MemoryRegion& spec = agent->rank_.regions[i];
    if (r.id != spec.id || r.size != spec.size) {
      return InvalidArgument(where + ": region '" + spec.id + "' (" + std::to_string(spec.size) +
                             " bytes) differs from the weight memory's '" + r.id + "' (" + std::to_string(r.size) +
                             " bytes)");
    }
    StatusOr<std::unique_ptr<transport::MemoryRegion>> mr = agent->engine_->Register(r.data, r.size, r.kind, r.device);
    if (!mr.ok()) return mr.status().WithContext(where + ": registering region '" + spec.id + "'");
    spec.descriptor = DescriptorToText((*mr)->descriptor());
    agent->regions_.push_back(std::move(mr).value());
  }
  const size_t weight_regions = agent->regions_.size();
  if (agent->options_.deltas) WSYNC_RETURN_IF_ERROR(agent->RegisterInboxes(landing));
  std::string inboxes;
  if (agent->regions_.size() > weight_regions) {
    uint64_t bytes = 0;
    for (const auto& [id, inbox] : agent->inboxes_) bytes += inbox->bytes;
    inboxes = " and " + std::to_string(agent->regions_.size() - weight_regions) + " delta inbox(es) of " +
              std::to_string(bytes) + " bytes";
  }
  if (!agent->no_inbox_.empty()) {
    inboxes += " (device regions without an inbox take full writes: " + agent->no_inbox_ + ")";
  }
  agent->Log(where + ": registered " + std::to_string(weight_regions) + " region(s) of " +
             (agent->options_.shadow ? "a shadow of '" : "'") + agent->memory_->name() + "'" + inboxes + " on " +
             std::to_string(agent->engine_->num_nics()) + " NIC(s) of " + agent->engine_->provider());
  return agent;
}

Status InferenceAgent::RegisterInboxes(const std::vector<WeightMemory::Region>& landing) {
  const std::string where = "inference rank " + std::to_string(rank_.rank);
  for (const WeightMemory::Region& r : landing) {
    auto inbox = std::make_unique<Inbox>();
    inbox->bytes = std::max<uint64_t>(delta::InboxBytes(r.size), delta::kSlotAlign);
    inbox->of = &r;
    if (r.kind == transport::MemoryKind::kHost) {
      void* p = mmap(nullptr, inbox->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) {
        return ResourceExhausted(where + ": cannot map the " + std::to_string(inbox->bytes) +
                                 "-byte delta inbox of region '" + r.id + "'");
      }
      inbox->data = static_cast<uint8_t*>(p);
    } else {
      // On the region's device, registered as the region is: the trainers'
      // delta writes land as its whole writes would.
      StatusOr<uint8_t*> p = memory_->AllocateInbox(r, inbox->bytes);
      if (p.status().code() == StatusCode::kUnimplemented) {
        no_inbox_ = p.status().message();
        continue;  // this region takes every write whole
      }
      if (!p.ok()) return p.status().WithContext(where + ": the delta inbox of region '" + r.id + "'");
      inbox->data = *p;
      inbox->owner = memory_.get();
    }
    inbox->region = {delta::InboxRegionId(r.id), inbox->data, inbox->bytes, r.kind, r.device};
    StatusOr<std::unique_ptr<transport::MemoryRegion>> mr =
        engine_->Register(inbox->data, inbox->bytes, r.kind, r.device);
    if (!mr.ok()) return mr.status().WithContext(where + ": registering the delta inbox of region '" + r.id + "'");
    rank_.regions.push_back({inbox->region.id, inbox->bytes, DescriptorToText((*mr)->descriptor())});
    regions_.push_back(std::move(mr).value());
    inboxes_.emplace(r.id, std::move(inbox));
  }
  return Status::Ok();
}

uint64_t InferenceAgent::landed_base() const {
  std::lock_guard<std::mutex> lock(mu_);
  return landed_base_;
}

StatusOr<DeltaApplied> InferenceAgent::ApplyDeltas(uint64_t v) {
  const auto t0 = Clock::now();
  const std::string me = "inference rank " + std::to_string(rank_.rank) + ": version " + std::to_string(v);
  DeltaApplied done;
  done.inboxes = !inboxes_.empty();
  std::vector<IncomingWrite> writes;
  uint64_t base;
  {
    std::lock_guard<std::mutex> lock(mu_);
    writes = writes_;
    base = landed_base_;
  }
  std::map<std::string, const WeightMemory::Region*> landing;
  for (const WeightMemory::Region& r : options_.shadow ? options_.shadow->regions() : memory_->regions())
    landing[r.id] = &r;
  for (const IncomingWrite& w : writes) {
    done.write_bytes += w.bytes;
    auto inbox = inboxes_.find(w.region);
    if (inbox == inboxes_.end()) continue;
    const delta::Slot slot = delta::SlotOf(w.offset, w.bytes);
    if (slot.bytes < delta::kSlotHeaderBytes + delta::kHeaderBytes) continue;  // too small for any delta
    const Inbox& box = *inbox->second;
    const uint8_t* at = box.data + slot.at;
    uint8_t head[delta::kSlotHeaderBytes];
    if (box.owner != nullptr) {  // device memory: its owner reads the header back
      WSYNC_RETURN_IF_ERROR(memory_->Read(box.region, slot.at, sizeof head, head).WithContext(me));
    } else {
      std::memcpy(head, at, sizeof head);
    }
    delta::SlotHeader h;
    if (!delta::ReadSlotHeader(head, &h) || h.version != v) continue;  // this write came whole, in place
    const std::string what = "tensor '" + w.tensor + "' (region '" + w.region + "' bytes [" +
                             std::to_string(w.offset) + ", " + std::to_string(w.offset + w.bytes) + "))";
    if (h.base != base) {
      return FailedPrecondition(
          me + ": " + what + ": a delta against version " + std::to_string(h.base) + ", but this rank holds " +
          (base == kNoVersion ? std::string("no complete version") : "version " + std::to_string(base)) +
          "; not applied (the version fails; the next one must come in full)");
    }
    if (h.delta_bytes > slot.bytes - delta::kSlotHeaderBytes) {
      return DataLoss(me + ": " + what + ": its delta claims " + std::to_string(h.delta_bytes) +
                      " bytes, its slot holds " + std::to_string(slot.bytes - delta::kSlotHeaderBytes));
    }
    const WeightMemory::Region& into = *landing.at(w.region);
    uint8_t* target = into.data + w.offset;  // SetPlan checked the bounds
    const uint8_t* d = at + delta::kSlotHeaderBytes;
    WSYNC_RETURN_IF_ERROR((box.owner == nullptr ? delta::Apply(d, h.delta_bytes, target, w.bytes, w.tensor.c_str())
                                                : memory_->ApplyDelta(into, d, h.delta_bytes, target, w.bytes,
                                                                      w.tensor.c_str()))
                              .WithContext(me + ": " + what));
    ++done.writes;
    done.delta_bytes += delta::kSlotHeaderBytes + h.delta_bytes;
    done.bytes += w.bytes;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    landed_base_ = v;
  }
  done.seconds = Seconds(Clock::now() - t0);
  return done;
}

Status InferenceAgent::SetPlan(const InferenceRankPlan& strided) {
  // One entry per write that arrives: the checks, the expected immediates,
  // the checksums and the shadow's copy-out all count and place single
  // writes.
  InferenceRankPlan plan = strided;
  ExpandPlanes(&plan);
  if (plan.rank != rank_.rank) {
    return InvalidArgument("inference rank " + std::to_string(rank_.rank) + ": got the plan of rank " +
                           std::to_string(plan.rank));
  }
  // Scoped write access: every write the plan announces must land inside a
  // region this rank registered. Its keys cover nothing else, and a plan
  // that says otherwise (a planner bug, a forged or stale plan) is refused
  // before a version could expect its immediates.
  const std::string me = "inference rank " + std::to_string(rank_.rank);
  std::map<std::string, uint64_t> sizes;
  for (const WeightMemory::Region& r : memory_->regions()) sizes[r.id] = r.size;
  uint64_t arrivals = 0;
  for (const IncomingWrite& w : plan.writes) {
    auto it = sizes.find(w.region);
    if (it == sizes.end()) {
      return OutOfRange(me + ": refusing the plan: it writes tensor '" + w.tensor + "' into region '" + w.region +
                        "', which this rank did not register");
    }
    if (w.offset > it->second || w.bytes > it->second - w.offset) {
      return OutOfRange(me + ": refusing the plan: it writes bytes [" + std::to_string(w.offset) + ", " +
                        std::to_string(w.offset + w.bytes) + ") of region '" + w.region + "' (" +
                        std::to_string(it->second) + " bytes) for tensor '" + w.tensor +
                        "', outside what this rank registered");
    }
    arrivals += engine_->ArrivalsPerWrite(w.bytes);
  }
  if (arrivals > std::numeric_limits<uint32_t>::max()) {
    return OutOfRange("inference rank " + std::to_string(rank_.rank) + ": " + std::to_string(arrivals) +
                      " arrivals per version exceed the 32-bit expect count");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    planned_ = true;
    landed_base_ = kNoVersion;
    arrivals_ = static_cast<uint32_t>(arrivals);
    writes_ = plan.writes;
  }
  Log("inference rank " + std::to_string(rank_.rank) + ": plan: " + std::to_string(plan.writes.size()) +
      " writes, " + std::to_string(plan.bytes) + " bytes, " + std::to_string(arrivals) +
      " immediates per version");
  return Status::Ok();
}

bool InferenceAgent::has_plan() const {
  std::lock_guard<std::mutex> lock(mu_);
  return planned_;
}

uint32_t InferenceAgent::arrivals_per_version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return arrivals_;
}

bool InferenceAgent::begun(uint64_t v) const {
  std::lock_guard<std::mutex> lock(mu_);
  return begun_.count(v) != 0;
}

Status InferenceAgent::BeginVersion(uint64_t v, Clock::time_point deadline) {
  const Clock::time_point now = Clock::now();
  uint32_t expected = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!planned_) {
      return FailedPrecondition("inference rank " + std::to_string(rank_.rank) + ": version " +
                                std::to_string(v) + " started before the plan arrived");
    }
    if (!begun_.emplace(v, arrivals_).second) return Status::Ok();
    while (begun_.size() > kKeptVersions) begun_.erase(begun_.begin());
    expected = arrivals_;
  }
  Log("inference rank " + std::to_string(rank_.rank) + ": version " + std::to_string(v) + ": expecting " +
      std::to_string(expected) + " immediates within " + Fixed3(Seconds(deadline - now)) + " s");
  const uint32_t imm = static_cast<uint32_t>(v);
  Status s = engine_->Expect(
      imm, expected, [this, v, now](const Status& st) { OnVersionDone(v, now, st); }, deadline);
  if (!s.ok()) {
    // Refused before anything was registered: the callback never runs.
    OnVersionDone(v, now, s);
  }
  return Status::Ok();
}

bool InferenceAgent::AbandonVersion(uint64_t v, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (begun_.count(v) == 0 || finished_.count(v) != 0) return false;
    if (!abandoned_.emplace(v, why).second) return false;
  }
  MarkFailedHere(v);
  Log("inference rank " + std::to_string(rank_.rank) + ": version " + std::to_string(v) +
      ": failed elsewhere (" + why + "); it will not be marked complete here");
  return true;
}

void InferenceAgent::OnVersionDone(uint64_t v, Clock::time_point begun, const Status& status) {
  VersionOutcome out;
  out.version = v;
  out.seconds = Seconds(Clock::now() - begun);
  std::string line = "inference rank " + std::to_string(rank_.rank) + ": version " + std::to_string(v);
  std::optional<std::string> abandoned;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = begun_.find(v);
    out.expected = it == begun_.end() ? 0 : it->second;
    auto a = abandoned_.find(v);
    if (a != abandoned_.end()) {
      abandoned = a->second;
      abandoned_.erase(a);
    }
  }
  if (status.ok() && abandoned) {
    // Every write landed, but the version had already failed: announcing
    // it now would contradict the controller.
    out.status = Aborted("inference rank " + std::to_string(rank_.rank) + ": version " + std::to_string(v) +
                         ": every write landed after the version had failed (" + *abandoned + "); not marked complete");
    line += ": landed after it failed; not marked complete";
  } else if (status.ok() && options_.hold) {
    out.status = Status::Ok();
    out.held = true;
    line += ": every write landed, " + std::to_string(out.expected) + " immediates in " + Fixed3(out.seconds) +
            " s; held until checked";
  } else if (status.ok()) {
    // Every arrival of v was counted, and a write's data is in memory before
    // its arrival is: now, and only now, the engine may see v.
    const bool moved = memory_->MarkComplete(v);
    out.status = Status::Ok();
    line += ": complete, " + std::to_string(out.expected) + " immediates in " + Fixed3(out.seconds) + " s";
    if (!moved) line += " (older than the current complete version, which stays)";
  } else {
    if (!abandoned) MarkFailedHere(v);
    out.status = status.WithContext("inference rank " + std::to_string(rank_.rank) + ": version " +
                                    std::to_string(v) + " failed");
    line += ": failed: " + status.ToString();
  }
  Log(line);  // before anyone can report it, so the log reads in order
  {
    std::lock_guard<std::mutex> lock(mu_);
    finished_[v] = out;
    while (finished_.size() > kKeptVersions) finished_.erase(finished_.begin());
    outcomes_.push_back(out);
  }
  cv_.notify_all();
}

Status InferenceAgent::Verify(uint64_t v, const std::vector<WriteChecksum>& expected, bool landed) const {
  const std::string me = "inference rank " + std::to_string(rank_.rank) + ": version " + std::to_string(v);
  std::vector<IncomingWrite> writes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!planned_) return FailedPrecondition(me + ": no plan to verify against");
    writes = writes_;
  }
  std::map<std::pair<std::string, uint64_t>, const WriteChecksum*> by_place;
  for (const WriteChecksum& c : expected) {
    if (!by_place.emplace(std::make_pair(c.region, c.offset), &c).second)
      return FailedPrecondition(me + ": two checksums for region '" + c.region + "' offset " + std::to_string(c.offset));
  }
  std::map<std::string, const WeightMemory::Region*> regions;
  const bool in_shadow = landed && options_.shadow != nullptr;
  for (const WeightMemory::Region& r : in_shadow ? options_.shadow->regions() : memory_->regions()) regions[r.id] = &r;
  // Every write's range first (its checksum from the trainers found), then
  // all hashed in one call (on a GPU, one batch of kernels), then compared
  // in the plan's order: the first tensor that differs is named.
  std::vector<WeightMemory::Range> ranges;
  std::vector<const WriteChecksum*> wanted;
  auto what_of = [](const IncomingWrite& w) {
    return "tensor '" + w.tensor + "' (region '" + w.region + "' bytes [" + std::to_string(w.offset) + ", " +
           std::to_string(w.offset + w.bytes) + "))";
  };
  for (const IncomingWrite& w : writes) {
    auto it = by_place.find({w.region, w.offset});
    if (it == by_place.end()) return FailedPrecondition(me + ": no checksum from the trainers for " + what_of(w));
    const WriteChecksum& want = *it->second;
    by_place.erase(it);
    if (want.bytes != w.bytes)
      return FailedPrecondition(me + ": " + what_of(w) + ": the trainers hashed " + std::to_string(want.bytes) +
                                " bytes");
    ranges.push_back({regions.at(w.region), w.offset, w.bytes});  // SetPlan checked every write's region
    wanted.push_back(&want);
  }
  std::vector<uint64_t> got(ranges.size(), 0);
  WSYNC_RETURN_IF_ERROR(memory_->Checksums(ranges, got.data()).WithContext(me + ": checksums"));
  for (size_t i = 0; i < writes.size(); ++i) {
    if (got[i] != wanted[i]->hash)
      return DataLoss(me + ": " + what_of(writes[i]) + " differs from what the trainers sent: checksum " +
                      ChecksumText(got[i]) + " here, " + ChecksumText(wanted[i]->hash) + " sent");
  }
  if (!by_place.empty()) {
    const WriteChecksum& c = *by_place.begin()->second;
    return FailedPrecondition(me + ": a checksum for region '" + c.region + "' offset " + std::to_string(c.offset) +
                              ", which the plan does not write here");
  }
  return Status::Ok();
}

Status InferenceAgent::Commit(uint64_t v) {
  const std::string me = "inference rank " + std::to_string(rank_.rank) + ": version " + std::to_string(v);
  std::string copied;
  if (options_.shadow != nullptr) {
    const auto t0 = Clock::now();
    std::vector<IncomingWrite> writes;
    {
      std::lock_guard<std::mutex> lock(mu_);
      writes = writes_;
    }
    // The planned bytes only (a region may hold bytes no trainer writes),
    // adjacent writes as one copy.
    std::sort(writes.begin(), writes.end(), [](const IncomingWrite& a, const IncomingWrite& b) {
      return std::tie(a.region, a.offset) < std::tie(b.region, b.offset);
    });
    std::map<std::string, size_t> index;
    for (size_t i = 0; i < memory_->regions().size(); ++i) index[memory_->regions()[i].id] = i;
    memory_->MarkCommitting(v);
    uint64_t bytes = 0;
    auto copy_out = [&]() -> Status {
      for (size_t i = 0; i < writes.size();) {
        uint64_t end = writes[i].offset + writes[i].bytes;
        size_t j = i + 1;
        for (; j < writes.size() && writes[j].region == writes[i].region && writes[j].offset == end; ++j)
          end += writes[j].bytes;
        const size_t r = index.at(writes[i].region);
        WSYNC_RETURN_IF_ERROR(options_.shadow->CopyOut(options_.shadow->regions()[r], memory_->regions()[r],
                                                       writes[i].offset, end - writes[i].offset)
                                  .WithContext(me + ": copying region '" + writes[i].region + "' out of the shadow"));
        bytes += end - writes[i].offset;
        i = j;
      }
      return options_.shadow->Finish().WithContext(me + ": copying out of the shadow");
    };
    if (Status s = copy_out(); !s.ok()) {
      memory_->MarkFailed(v);  // the weights are a mix now, and v will not complete
      return s;
    }
    copied = " (" + std::to_string(bytes) + " bytes copied out of the shadow in " + Fixed3(Seconds(Clock::now() - t0)) +
             " s)";
  }
  const bool moved = memory_->MarkComplete(v);
  Log(me + ": complete" + copied + (moved ? "" : " (older than the current complete version, which stays)"));
  return Status::Ok();
}

void InferenceAgent::MarkFailedHere(uint64_t v) {
  {
    // Some of v's writes may have landed: no delta may build on these bytes.
    std::lock_guard<std::mutex> lock(mu_);
    landed_base_ = kNoVersion;
  }
  // In shadow mode the engine's weights were not touched (unless a commit
  // started, which marked them itself).
  if (options_.shadow != nullptr) {
    memory_->MarkNotApplied(v);
  } else {
    memory_->MarkFailed(v);
  }
}

void InferenceAgent::Reject(uint64_t v, const Status& why) {
  MarkFailedHere(v);
  Log("inference rank " + std::to_string(rank_.rank) + ": version " + std::to_string(v) + ": not complete: " +
      why.ToString());
}

std::vector<VersionOutcome> InferenceAgent::TakeOutcomes(std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, wait, [&] { return !outcomes_.empty(); });
  std::vector<VersionOutcome> out(outcomes_.begin(), outcomes_.end());
  outcomes_.clear();
  return out;
}

StatusOr<VersionOutcome> InferenceAgent::WaitVersion(uint64_t v, std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, wait, [&] { return finished_.count(v) != 0; })) {
    return DeadlineExceeded("inference rank " + std::to_string(rank_.rank) + ": version " + std::to_string(v) +
                            " has no outcome yet");
  }
  return finished_.at(v);
}

void InferenceAgent::Log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

}  // namespace wsync::inference
