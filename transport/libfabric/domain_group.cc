#include "transport/libfabric/domain_group.h"

#include <rdma/fi_errno.h>

#include <sched.h>

#include <algorithm>
#include <cstring>

#include "transport/libfabric/cpu_affinity.h"
#include "transport/libfabric/cuda_context.h"
#include "transport/libfabric/fabric_info.h"
#include "transport/libfabric/memory_region.h"

namespace wsync::transport::fabric {
namespace {

constexpr uint32_t kSlots = 64;                // send and recv slots each
constexpr uint32_t kSlotSize = kMaxControlMessage;
constexpr uint64_t kScratch = 64;              // zero-byte writes point here
constexpr uint64_t kBounceSize = kScratch + 2ull * kSlots * kSlotSize;
constexpr size_t kCqBatch = 64;
constexpr size_t kMaxPagesPerOp = 8;

// Recv contexts are tagged pointers into this range so a CQ entry can say
// "recv slot i" without a per-slot object.
void* RecvContext(uint32_t slot) { return reinterpret_cast<void*>(static_cast<uintptr_t>(slot + 1)); }

const char* KindName(RequestKind kind) {
  switch (kind) {
    case RequestKind::kWrite: return "write";
    case RequestKind::kPaged: return "paged write";
    case RequestKind::kScatter: return "scatter";
    case RequestKind::kBarrier: return "barrier";
    case RequestKind::kSend: return "send";
    default: return "request";
  }
}

}  // namespace

StatusOr<std::unique_ptr<DomainGroup>> DomainGroup::Start(const LibfabricOptions& options,
                                                          CallbackThread* callbacks) {
  if (options.num_nics == 0 || options.num_nics > kMaxNics)
    return InvalidArgument("num_nics " + std::to_string(options.num_nics) + " outside 1.." +
                           std::to_string(kMaxNics));
  std::unique_ptr<DomainGroup> group(new DomainGroup(options, callbacks));
  std::promise<Status> started;
  std::future<Status> result = started.get_future();
  // libfabric's CUDA calls run on the worker: give it this thread's context.
  const CudaContextCarrier cuda = options.enable_hmem ? CudaContextCarrier::Capture(options.gpu) : CudaContextCarrier();
  group->thread_ = std::thread([g = group.get(), &started, cuda] {
    cuda.Apply();
    g->Main(&started);
  });
  Status status = result.get();
  if (!status.ok()) return status;  // the worker has exited; ~DomainGroup joins
  return group;
}

DomainGroup::~DomainGroup() {
  stop_.store(true);
  parker_.Unpark();
  if (thread_.joinable()) thread_.join();
}

Status DomainGroup::Open() {
  WSYNC_RETURN_IF_ERROR(PinCurrentThread(options_.gpu_pci_bus_id, options_.gpu, options_.core, &pinned_where_));
  WSYNC_ASSIGN_OR_RETURN(InfoPtr info, ProbeProvider(options_));
  virtual_addressing_ = (info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0;
  pages_per_op_ = static_cast<uint32_t>(std::clamp<size_t>(
      std::min({info->tx_attr->iov_limit, info->tx_attr->rma_iov_limit, size_t{options_.max_pages_per_op},
                size_t{kMaxPagesPerOp}}),
      1, kMaxPagesPerOp));
  const size_t cq_size = std::max<size_t>(4096, 4 * options_.max_inflight_per_nic + 2 * kSlots);
  for (uint32_t i = 0; i < options_.num_nics; ++i) {
    const std::string where = options_.provider + " NIC " + std::to_string(i);
    WSYNC_ASSIGN_OR_RETURN(FabricDomain domain, FabricDomain::Open(*info));
    WSYNC_ASSIGN_OR_RETURN(FabricCq cq, FabricCq::Open(domain.domain(), cq_size));
    WSYNC_ASSIGN_OR_RETURN(FabricEndpoint ep, FabricEndpoint::Open(domain, cq));
    address_.nics.push_back(ep.name());
    nics_.push_back(std::make_unique<Nic>(Nic{std::move(domain), std::move(cq), std::move(ep)}));
  }
  bounce_.reset(new char[kBounceSize]());
  for (uint32_t i = 0; i < options_.num_nics; ++i) {
    WSYNC_ASSIGN_OR_RETURN(FabricMr mr, FabricMr::Register(nics_[i]->domain, bounce_.get(), kBounceSize,
                                                           MemoryKind::kHost, 0, NextRequestedKey()));
    bounce_mrs_.push_back(std::move(mr));
  }
  for (uint32_t s = kSlots; s-- > 0;) free_send_slots_.push_back(s);
  char* recv_base = bounce_.get() + kScratch + kSlots * kSlotSize;
  for (uint32_t s = 0; s < kSlots; ++s) {
    ssize_t ret = nics_[0]->endpoint.PostRecv(recv_base + s * kSlotSize, kSlotSize,
                                              bounce_mrs_[0].desc(), RecvContext(s));
    if (ret != 0) return FiError("fi_recv", ret, "posting control receive buffers");
  }
  return Status::Ok();
}

void DomainGroup::Main(std::promise<Status>* started) {
  if (options_.on_worker_start) options_.on_worker_start();
  Status status = Open();
  const bool ok = status.ok();
  started->set_value(std::move(status));  // `started` dies after this
  if (!ok) {
    nics_.clear();
    return;
  }
  Clock::time_point last_check = Clock::now();
  Clock::time_point last_busy = last_check;
  uint32_t spins = 0;
  while (!stop_.load(std::memory_order_relaxed)) {
    bool busy = false;
    while (QueueNode* node = queue_.Pop()) {
      Accept(static_cast<Request*>(node));
      busy = true;
    }
    bool progress = busy;
    if (pending_head_ != nullptr) progress |= PostPending();
    for (uint32_t n = 0; n < nics_.size(); ++n) progress |= Poll(n) > 0;
    if (busy || !Idle()) spins = 0;
    // Waiting on the peer with nothing to do: let a thread sharing this
    // core (our callback thread, the caller) run; costs ~0.3 us.
    if (progress) {
      fruitless_ = 0;
    } else if (++fruitless_ >= 128) {
      fruitless_ = 0;
      sched_yield();
    }
    // Clock reads are cheap (vDSO) but not free: every 64 turns.
    if ((++spins & 63) == 0 || spins == 1) {
      Clock::time_point now = Clock::now();
      if (now - last_check >= std::chrono::milliseconds(1)) {
        CheckDeadlines(now);
        last_check = now;
      }
      if (!Idle() || busy) last_busy = now;
      if (options_.idle_after.count() > 0 && Idle() && now - last_busy >= options_.idle_after) {
        parker_.PrepareToPark();
        if (queue_.Empty() && !stop_.load()) parker_.Park(options_.idle_nap);
        else parker_.CancelPark();
      }
    }
  }
  AbortEverything();
}

Status DomainGroup::RunOnWorker(std::function<Status()> fn) {
  std::promise<Status> done;
  std::future<Status> result = done.get_future();
  auto* r = new Request;
  r->kind = RequestKind::kControl;
  r->control = [&] {
    done.set_value(nics_.empty() ? Aborted("engine shut down") : fn());
  };
  Submit(r);
  return result.get();
}

StatusOr<PeerId> DomainGroup::AddPeerOnWorker(const PeerAddress& address) {
  if (address.nics.size() != nics_.size())
    return InvalidArgument("peer has " + std::to_string(address.nics.size()) + " NICs, this engine " +
                           std::to_string(nics_.size()) + "; all peers must use the same NIC count");
  auto it = peer_ids_.find(address.nics[0]);
  if (it != peer_ids_.end()) return it->second;
  std::array<fi_addr_t, kMaxNics> addrs{};
  for (uint32_t i = 0; i < nics_.size(); ++i) {
    StatusOr<fi_addr_t> a = nics_[i]->domain.InsertAddress(address.nics[i]);
    if (!a.ok()) return a.status().WithContext("add peer, NIC " + std::to_string(i));
    addrs[i] = *a;
  }
  const PeerId id = static_cast<PeerId>(peers_.size());
  peers_.push_back(addrs);
  peer_ids_.emplace(address.nics[0], id);
  num_peers_.store(id + 1, std::memory_order_release);
  return id;
}

void DomainGroup::Accept(Request* r) {
  switch (r->kind) {
    case RequestKind::kControl:
      r->control();
      delete r;
      return;
    case RequestKind::kExpect: {
      void* fired = nullptr;
      if (!imm_counter_.Expect(r->imm, r->count, r, r->expect_deadline, &fired)) {
        Hand(r, FailedPrecondition("expect imm " + std::to_string(r->imm) +
                                   ": another Expect of this imm is still pending"));
      } else if (fired != nullptr) {
        Hand(r, Status::Ok());
      }
      return;
    }
    case RequestKind::kRecv:
      pending_recvs_.push_back(r);
      MatchRecvs();
      return;
    case RequestKind::kWrite:
      r->total_ops = ArrivalsPerWrite(r->write.length);
      break;
    case RequestKind::kPaged:
      r->total_ops = ArrivalsPerPagedWrite(static_cast<uint32_t>(r->paged.src_pages.indices.size()));
      break;
    case RequestKind::kScatter:
      r->total_ops = static_cast<uint32_t>(r->scatter.slices.size());
      break;
    case RequestKind::kBarrier:
      r->total_ops = static_cast<uint32_t>(r->barrier.peers.size());
      break;
    case RequestKind::kSend:
      r->total_ops = 1;
      break;
  }
  uint64_t bytes = 0;
  switch (r->kind) {
    case RequestKind::kWrite: bytes = r->write.length; break;
    case RequestKind::kPaged: bytes = r->paged.page_length * r->paged.src_pages.indices.size(); break;
    case RequestKind::kScatter:
      for (const ScatterSlice& s : r->scatter.slices) bytes += s.length;
      break;
    case RequestKind::kSend: bytes = r->message.size(); break;
    default: break;
  }
  // Charged the same on post and on completion, so the count never drifts.
  r->op_charge = r->total_ops ? bytes / r->total_ops : 0;
  const MemoryRegion* src = r->kind == RequestKind::kWrite   ? r->write.src
                            : r->kind == RequestKind::kPaged ? r->paged.src
                            : r->kind == RequestKind::kScatter ? r->scatter.src
                                                                : nullptr;
  r->cuda_source = src != nullptr && src->kind() == MemoryKind::kCuda;
  r->base_nic = next_nic_;
  next_nic_ = (next_nic_ + 1) % nics_.size();
  r->deadline = Clock::now() + options_.op_timeout;
  LinkActive(r);
  if (r->total_ops == 0) {
    MaybeFinish(r);
    return;
  }
  r->next_pending = nullptr;
  if (pending_tail_ != nullptr) pending_tail_->next_pending = r;
  else pending_head_ = r;
  pending_tail_ = r;
}

bool DomainGroup::PostPending() {
  // FIFO, but a request that cannot post (its NIC is full, its peer's queue
  // returns FI_EAGAIN: a dead peer) does not hold back those behind it; the
  // scan stops after a few blocked ones in a row to stay cheap.
  constexpr uint32_t kMaxBlockedInARow = 8;
  bool posted = false;
  uint32_t blocked_in_a_row = 0;
  Request* prev = nullptr;
  Request* r = pending_head_;
  while (r != nullptr && blocked_in_a_row < kMaxBlockedInARow) {
    bool blocked = false;
    while (!r->finished && r->posted_ops < r->total_ops) {
      int ret = PostOne(r);
      if (ret == 0) {
        blocked = true;
        break;
      }
      if (ret < 0) {
        r->total_ops = r->posted_ops;  // post nothing more; wait for what is out
        break;
      }
      posted = true;
    }
    Request* next = r->next_pending;
    if (blocked && !r->finished) {
      ++blocked_in_a_row;
      prev = r;
      r = next;
      continue;
    }
    blocked_in_a_row = 0;
    if (r->finished) r->total_ops = r->posted_ops;  // timed out: stop posting
    if (prev != nullptr) prev->next_pending = next;
    else pending_head_ = next;
    if (pending_tail_ == r) pending_tail_ = prev;
    r->next_pending = nullptr;
    MaybeFinish(r);  // may delete r
    r = next;
  }
  return posted;
}

int DomainGroup::PostOne(Request* r) {
  const uint32_t i = r->posted_ops;
  const uint32_t n = static_cast<uint32_t>(nics_.size());
  uint32_t nic = r->kind == RequestKind::kSend ? 0 : (r->base_nic + i) % n;
  if (inflight_[nic] >= options_.max_inflight_per_nic) return 0;
  if (inflight_[nic] > 0 && InflightBytes(r, nic) + r->op_charge > InflightByteCap(r)) return 0;
  const LibfabricMemoryRegion* src = nullptr;
  const RemoteMemory* dst = nullptr;
  uint64_t local_offset = 0, remote_offset = 0, length = 0;
  bool has_imm = false;
  uint32_t imm = 0;
  switch (r->kind) {
    case RequestKind::kWrite: {
      const SingleWrite& w = r->write;
      uint64_t chunk = w.length;
      if (r->total_ops > 1) chunk = ((w.length + r->total_ops - 1) / r->total_ops + 4095) & ~uint64_t{4095};
      const uint64_t start = std::min<uint64_t>(chunk * i, w.length);
      src = static_cast<const LibfabricMemoryRegion*>(w.src);
      dst = &w.dst;
      local_offset = w.src_offset + start;
      remote_offset = w.dst_offset + start;
      length = std::min<uint64_t>(chunk, w.length - start);
      has_imm = w.imm.has_value();
      imm = w.imm.value_or(0);
      break;
    }
    case RequestKind::kPaged: {
      const PagedWrite& p = r->paged;
      src = static_cast<const LibfabricMemoryRegion*>(p.src);
      dst = &p.dst;
      has_imm = p.imm.has_value();
      imm = p.imm.value_or(0);
      const size_t first = size_t{i} * pages_per_op_;
      const size_t count = std::min<size_t>(pages_per_op_, p.src_pages.indices.size() - first);
      if (count > 1) return PostPages(r, nic, first, count);
      local_offset = p.src_pages.offset + uint64_t{p.src_pages.indices[first]} * p.src_pages.stride;
      remote_offset = p.dst_pages.offset + uint64_t{p.dst_pages.indices[first]} * p.dst_pages.stride;
      length = p.page_length;
      break;
    }
    case RequestKind::kScatter: {
      const ScatterSlice& s = r->scatter.slices[i];
      src = static_cast<const LibfabricMemoryRegion*>(r->scatter.src);
      dst = &s.dst;
      local_offset = s.src_offset;
      remote_offset = s.dst_offset;
      length = s.length;
      has_imm = r->scatter.imm.has_value();
      imm = r->scatter.imm.value_or(0);
      break;
    }
    case RequestKind::kBarrier:
      dst = &r->barrier.peers[i];
      has_imm = true;
      imm = r->barrier.imm;
      break;
    case RequestKind::kSend: {
      nic = 0;  // receive buffers are posted on NIC 0 only
      if (inflight_[0] >= options_.max_inflight_per_nic || free_send_slots_.empty()) return 0;
      r->send_slot = free_send_slots_.back();
      free_send_slots_.pop_back();
      char* slot = bounce_.get() + kScratch + r->send_slot * kSlotSize;
      std::memcpy(slot, r->message.data(), r->message.size());
      ssize_t ret = nics_[0]->endpoint.PostSend(slot, r->message.size(), bounce_mrs_[0].desc(),
                                                peers_[r->peer][0], r);
      if (ret == -FI_EAGAIN) {
        ++r->eagain;
        free_send_slots_.push_back(r->send_slot);
        r->send_slot = UINT32_MAX;
        return 0;
      }
      if (ret != 0) {
        free_send_slots_.push_back(r->send_slot);
        r->send_slot = UINT32_MAX;
        r->status = FiError("fi_send", ret, "to peer " + std::to_string(r->peer));
        return -1;
      }
      ++inflight_[0];
      InflightBytes(r, 0) += r->op_charge;
      ++r->nic_ops[0];
      ++r->posted_ops;
      return 1;
    }
    default:
      return -1;
  }
  // Zero-byte writes still name a valid local buffer and remote region
  // (EFA rejects a null target descriptor).
  const void* buf = bounce_.get();
  void* desc = bounce_mrs_[nic].desc();
  if (length > 0) {
    buf = static_cast<const char*>(src->data()) + local_offset;
    desc = src->desc(nic);
  }
  ssize_t ret = nics_[nic]->endpoint.PostWrite(buf, length, desc, peers_[dst->peer][nic],
                                               dst->address + remote_offset, dst->keys[nic], has_imm,
                                               imm, r);
  if (ret == -FI_EAGAIN) return ++r->eagain, 0;
  if (ret != 0) {
    r->status = FiError(has_imm ? "fi_writedata" : "fi_write", ret,
                        std::string(KindName(r->kind)) + " to peer " + std::to_string(dst->peer) +
                            " via NIC " + std::to_string(nic));
    return -1;
  }
  ++inflight_[nic];
  InflightBytes(r, nic) += r->op_charge;
  ++r->nic_ops[nic];
  ++r->posted_ops;
  return 1;
}

int DomainGroup::PostPages(Request* r, uint32_t nic, size_t first, size_t count) {
  const PagedWrite& p = r->paged;
  const auto* src = static_cast<const LibfabricMemoryRegion*>(p.src);
  iovec iov[kMaxPagesPerOp];
  void* desc[kMaxPagesPerOp];
  fi_rma_iov rma[kMaxPagesPerOp];
  for (size_t k = 0; k < count; ++k) {
    const uint64_t s = p.src_pages.offset + uint64_t{p.src_pages.indices[first + k]} * p.src_pages.stride;
    const uint64_t d = p.dst_pages.offset + uint64_t{p.dst_pages.indices[first + k]} * p.dst_pages.stride;
    iov[k] = {static_cast<char*>(src->data()) + s, p.page_length};
    desc[k] = src->desc(nic);
    rma[k] = {p.dst.address + d, p.page_length, p.dst.keys[nic]};
  }
  ssize_t ret = nics_[nic]->endpoint.PostWriteV(iov, desc, rma, count, peers_[p.dst.peer][nic], p.imm.has_value(),
                                                p.imm.value_or(0), r);
  if (ret == -FI_EAGAIN) return ++r->eagain, 0;
  if (ret != 0) {
    r->status = FiError("fi_writemsg", ret, "paged write to peer " + std::to_string(p.dst.peer) + " via NIC " +
                                                std::to_string(nic));
    return -1;
  }
  ++inflight_[nic];
  InflightBytes(r, nic) += r->op_charge;
  ++r->nic_ops[nic];
  ++r->posted_ops;
  return 1;
}

long DomainGroup::Poll(uint32_t n) {
  fi_cq_data_entry entries[kCqBatch];
  FabricCq& cq = nics_[n]->cq;
  long count = cq.Read(entries, kCqBatch);
  for (long k = 0; k < count; ++k) {
    const fi_cq_data_entry& e = entries[k];
    if (e.flags & FI_RECV) {
      OnRecv(static_cast<uint32_t>(reinterpret_cast<uintptr_t>(e.op_context) - 1), e.len);
    } else if (e.flags & FI_REMOTE_CQ_DATA) {
      if (Request* w = static_cast<Request*>(imm_counter_.OnArrival(static_cast<uint32_t>(e.data))))
        Hand(w, Status::Ok());
    } else if (e.op_context != nullptr) {
      OnLocalCompletion(static_cast<Request*>(e.op_context), n, Status::Ok());
    }
  }
  if (count == -FI_EAVAIL) {
    fi_cq_err_entry err;
    std::string message;
    Status read = cq.ReadError(&err, &message);
    if (!read.ok()) return 0;
    if (err.flags & FI_RECV) {
      // A failed control receive (e.g. a truncated message): repost the slot.
      OnRecv(static_cast<uint32_t>(reinterpret_cast<uintptr_t>(err.op_context) - 1), SIZE_MAX);
    } else if (err.op_context != nullptr) {
      Request* r = static_cast<Request*>(err.op_context);
      OnLocalCompletion(r, n, Internal("fi_cq_readerr: " + std::string(KindName(r->kind)) + " via NIC " +
                                       std::to_string(n) + " failed: " + message));
    }
    return 1;
  }
  return count > 0 ? count : 0;
}

void DomainGroup::OnLocalCompletion(Request* r, uint32_t nic, const Status& error) {
  if (!r->released) {
    --inflight_[nic];
    InflightBytes(r, nic) -= r->op_charge;
    --r->nic_ops[nic];
  }
  ++r->completed_ops;
  if (r->send_slot != UINT32_MAX) {
    free_send_slots_.push_back(r->send_slot);
    r->send_slot = UINT32_MAX;
  }
  if (!error.ok() && r->status.ok()) r->status = error;
  MaybeFinish(r);
}

void DomainGroup::OnRecv(uint32_t slot, size_t len) {
  char* buf = bounce_.get() + kScratch + (kSlots + slot) * kSlotSize;
  if (len != SIZE_MAX) received_.emplace_back(buf, len);
  ssize_t ret = nics_[0]->endpoint.PostRecv(buf, kSlotSize, bounce_mrs_[0].desc(), RecvContext(slot));
  (void)ret;  // with FI_RM_ENABLED reposting a consumed slot cannot overrun
  MatchRecvs();
}

void DomainGroup::MatchRecvs() {
  while (!received_.empty() && !pending_recvs_.empty()) {
    Request* r = pending_recvs_.front();
    pending_recvs_.pop_front();
    r->message = std::move(received_.front());
    received_.pop_front();
    Hand(r, Status::Ok());
  }
}

void DomainGroup::MaybeFinish(Request* r) {
  // Not all posted (it is still in the partly-posted FIFO, which takes it
  // out first) or not all completed.
  if (r->posted_ops < r->total_ops || r->completed_ops < r->posted_ops) return;
  UnlinkActive(r);
  if (r->finished) {
    delete r;
    return;
  }
  Hand(r, r->status);
}

void DomainGroup::Hand(Request* r, Status status) {
  r->status = std::move(status);
  callbacks_->Push(r);
}

void DomainGroup::CheckDeadlines(Clock::time_point now) {
  // The active list is newest first; requests that expire in the same pass
  // (a worker held up under load) are reported oldest first, so a caller
  // that keeps the first error names the write that waited longest, e.g.
  // the one to a dead peer that later writes to live peers queued behind.
  timed_out_.clear();
  for (Request* r = active_head_; r != nullptr; r = r->next_active)
    if (!r->finished && now >= r->deadline) timed_out_.push_back(r);
  for (auto it = timed_out_.rbegin(); it != timed_out_.rend(); ++it) {
    Request* r = *it;
    r->finished = true;
    // Its operations may never complete (dead peer): stop counting them
    // against the NICs' caps so other peers' requests keep flowing.
    for (uint32_t n = 0; n < nics_.size(); ++n) {
      inflight_[n] -= r->nic_ops[n];
      InflightBytes(r, n) -= uint64_t{r->nic_ops[n]} * r->op_charge;
      r->nic_ops[n] = 0;
    }
    r->released = true;
    auto* notice = new Notice;
    notice->done = std::move(r->done);
    // Say which side stalled: a provider that never took the operations
    // (FI_EAGAIN: the peer never connected or its queue stays full) or one
    // that took them and never completed them.
    std::string posted = std::to_string(r->posted_ops) + " posted";
    if (r->eagain > 0) posted += ", the provider answered FI_EAGAIN " + std::to_string(r->eagain) + " times";
    if (r->posted_ops < r->total_ops) {  // held back: by our caps, or by the provider
      posted += "; NIC 0 has " + std::to_string(inflight_[0]) + " operations (" +
                std::to_string(inflight_bytes_[0] + inflight_cuda_bytes_[0]) + " bytes) in flight";
    }
    notice->status = DeadlineExceeded(
        std::string(KindName(r->kind)) + ": " + std::to_string(r->total_ops - r->completed_ops) + " of " +
        std::to_string(r->total_ops) + " operations not completed after " +
        std::to_string(options_.op_timeout.count()) + " ms (" + posted +
        "); the peer is dead, unreachable, or dropped the write (e.g. a stale remote key)");
    callbacks_->Push(notice);
  }
  for (auto it = pending_recvs_.begin(); it != pending_recvs_.end();) {
    if ((*it)->expect_deadline > now) {
      ++it;
      continue;
    }
    Hand(*it, DeadlineExceeded("recv: no control message arrived before the deadline"));
    it = pending_recvs_.erase(it);
  }
  expired_.clear();
  imm_counter_.ExpireBefore(now, &expired_);
  for (const ImmCounter::Expired& e : expired_) {
    Hand(static_cast<Request*>(e.waiter),
         DeadlineExceeded("expect imm " + std::to_string(e.imm) + ": saw " + std::to_string(e.seen) + " of " +
                          std::to_string(e.expected) + " arrivals before the deadline"));
  }
}

void DomainGroup::LinkActive(Request* r) {
  r->prev_active = nullptr;
  r->next_active = active_head_;
  if (active_head_ != nullptr) active_head_->prev_active = r;
  active_head_ = r;
}

void DomainGroup::UnlinkActive(Request* r) {
  if (r->prev_active != nullptr) r->prev_active->next_active = r->next_active;
  else active_head_ = r->next_active;
  if (r->next_active != nullptr) r->next_active->prev_active = r->prev_active;
  r->prev_active = r->next_active = nullptr;
}

void DomainGroup::AbortEverything() {
  // Close the NICs first so no completion can name a request we hand off.
  bounce_mrs_.clear();
  nics_.clear();
  const Status aborted = Aborted("engine shut down before the request completed");
  while (QueueNode* node = queue_.Pop()) {
    Request* r = static_cast<Request*>(node);
    if (r->kind == RequestKind::kControl) {
      r->control();  // a control request still gets its answer
      delete r;
    } else {
      Hand(r, aborted);
    }
  }
  while (active_head_ != nullptr) {
    Request* r = active_head_;
    UnlinkActive(r);
    if (r->finished) delete r;
    else Hand(r, aborted);
  }
  pending_head_ = pending_tail_ = nullptr;
  for (Request* r : pending_recvs_) Hand(r, aborted);
  pending_recvs_.clear();
  expired_.clear();
  imm_counter_.TakeAllWaiters(&expired_);
  for (const ImmCounter::Expired& e : expired_) Hand(static_cast<Request*>(e.waiter), aborted);
}

}  // namespace wsync::transport::fabric
