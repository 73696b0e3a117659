// DomainGroup: the one worker thread of one GPU and all of that GPU's NICs.
//
// The worker pins itself near the GPU, then opens every NIC (fabric, domain,
// CQ, endpoint) so their memory is allocated after pinning, and from then
// on is the only thread that touches libfabric objects (FI_THREAD_DOMAIN).
// Each loop: take new requests from the lock-free queue, post more of the
// partly-posted ones (FI_EAGAIN or a full NIC leaves them for later), poll
// every CQ. Finished requests go to the CallbackThread.
//
// Owned by LibfabricEngine, which validates requests before Submit.
#pragma once

#include <array>
#include <atomic>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "transport/libfabric/callback_thread.h"
#include "transport/libfabric/fabric_cq.h"
#include "transport/libfabric/fabric_domain.h"
#include "transport/libfabric/fabric_endpoint.h"
#include "transport/libfabric/fabric_mr.h"
#include "transport/libfabric/imm_counter.h"
#include "transport/libfabric/libfabric_options.h"
#include "transport/libfabric/request.h"

namespace wsync::transport::fabric {

// One NIC's objects, in creation order (destroyed in reverse).
struct Nic {
  FabricDomain domain;
  FabricCq cq;
  FabricEndpoint endpoint;
};

class DomainGroup {
 public:
  // Starts the worker and waits until it has opened every NIC (or failed).
  static StatusOr<std::unique_ptr<DomainGroup>> Start(const LibfabricOptions& options,
                                                      CallbackThread* callbacks);
  // Stops the worker: queued and in-flight requests end with ABORTED.
  ~DomainGroup();

  // Any thread. Takes ownership of `request`.
  void Submit(Request* request) {
    queue_.Push(request);
    parker_.Unpark();
  }
  // Any thread except the worker: runs `fn` on the worker and waits.
  Status RunOnWorker(std::function<Status()> fn);

  // Fixed after Start; any thread.
  const LibfabricOptions& options() const { return options_; }
  const PeerAddress& address() const { return address_; }
  const std::string& provider() const { return options_.provider; }
  uint32_t num_nics() const { return options_.num_nics; }
  bool virtual_addressing() const { return virtual_addressing_; }
  const std::string& pinned_where() const { return pinned_where_; }
  uint32_t num_peers() const { return num_peers_.load(std::memory_order_acquire); }
  uint32_t ArrivalsPerPagedWrite(uint32_t pages) const { return (pages + pages_per_op_ - 1) / pages_per_op_; }
  uint32_t ArrivalsPerWrite(uint64_t length) const {
    return (options_.num_nics > 1 && length >= options_.split_threshold) ? options_.num_nics : 1;
  }

  // Worker only (inside RunOnWorker).
  Nic& nic(uint32_t i) { return *nics_[i]; }
  StatusOr<PeerId> AddPeerOnWorker(const PeerAddress& address);
  uint64_t NextRequestedKey() { return next_key_++; }

 private:
  explicit DomainGroup(const LibfabricOptions& options, CallbackThread* callbacks)
      : options_(options), callbacks_(callbacks) {}
  Status Open();
  void Main(std::promise<Status>* started);
  void Accept(Request* r);
  // Returns true if it posted anything.
  bool PostPending();
  // 1: posted, 0: must wait (EAGAIN or NIC full), -1: failed (r->status set).
  int PostOne(Request* r);
  int PostPages(Request* r, uint32_t nic, size_t first, size_t count);
  // Returns the number of CQ entries handled.
  long Poll(uint32_t n);
  void OnLocalCompletion(Request* r, uint32_t nic, const Status& error);
  void OnRecv(uint32_t slot, size_t len);
  void MaybeFinish(Request* r);
  void Hand(Request* r, Status status);  // request -> callback thread
  void CheckDeadlines(Clock::time_point now);
  void AbortEverything();
  void LinkActive(Request* r);
  void UnlinkActive(Request* r);
  void MatchRecvs();
  bool Idle() const { return pending_head_ == nullptr && active_head_ == nullptr; }

  const LibfabricOptions options_;
  CallbackThread* const callbacks_;
  MpscQueue queue_;
  Parker parker_;
  std::atomic<bool> stop_{false};
  std::atomic<uint32_t> num_peers_{0};
  PeerAddress address_;
  bool virtual_addressing_ = true;
  uint32_t pages_per_op_ = 1;
  std::string pinned_where_;
  std::thread thread_;

  // Worker-owned, created after pinning, in creation order.
  std::vector<std::unique_ptr<Nic>> nics_;
  std::unique_ptr<char[]> bounce_;      // scratch | send slots | recv slots
  std::vector<FabricMr> bounce_mrs_;    // bounce_ on every NIC
  std::vector<uint32_t> free_send_slots_;
  std::vector<std::array<fi_addr_t, kMaxNics>> peers_;
  std::unordered_map<std::string, PeerId> peer_ids_;  // key: NIC 0 address
  std::array<uint32_t, kMaxNics> inflight_{};
  std::array<uint64_t, kMaxNics> inflight_bytes_{};       // from host memory
  std::array<uint64_t, kMaxNics> inflight_cuda_bytes_{};  // from CUDA memory
  // The in-flight byte count and cap that request r is charged against.
  uint64_t& InflightBytes(const Request* r, uint32_t nic) {
    return r->cuda_source ? inflight_cuda_bytes_[nic] : inflight_bytes_[nic];
  }
  uint64_t InflightByteCap(const Request* r) const {
    return r->cuda_source ? options_.max_inflight_cuda_bytes_per_nic : options_.max_inflight_bytes_per_nic;
  }
  ImmCounter imm_counter_;
  std::vector<ImmCounter::Expired> expired_;
  std::vector<Request*> timed_out_;  // CheckDeadlines' scratch, reused
  std::deque<std::string> received_;
  std::deque<Request*> pending_recvs_;
  Request* pending_head_ = nullptr;
  Request* pending_tail_ = nullptr;
  Request* active_head_ = nullptr;
  uint32_t next_nic_ = 0;
  uint32_t fruitless_ = 0;  // loop turns in a row that found no work
  uint64_t next_key_ = 1;
};

}  // namespace wsync::transport::fabric
