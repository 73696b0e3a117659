// The transfer engine contract: one-sided RDMA writes with 32-bit immediates,
// counted at the receiver (IMMCOUNTER), plus small two-sided control messages.
//
// Called by the trainer/inference agents and the pipeline; implemented by a
// backend under transport/<backend>/ (libfabric today). Nothing here relies on
// delivery order: the only completion signal a receiver gets is "count
// arrivals of immediate X were seen", and the data of a write-with-immediate
// is in memory before its arrival is counted.
//
// Threads and blocking:
//   - Every method may be called from any thread, concurrently.
//   - Setup calls (Register, AddPeer, Import) block until the engine's worker
//     has done them; they are not for the data path.
//   - Data-path calls (Write, WritePaged, Scatter, Barrier, Send, Recv,
//     Expect) never block on the network: they validate, enqueue and return.
//     A non-OK return means the request was refused before anything was
//     posted and its callback will never run. An OK return means the callback
//     runs exactly once, later, on the engine's callback thread (never on the
//     caller's thread, never on the worker).
//   - Callbacks may call back into the engine. A callback that blocks stalls
//     every later callback of this engine.
// Ownership:
//   - The caller owns MemoryRegions; a region must outlive every request that
//     uses it and must be destroyed before the engine.
//   - Requests are taken by value (vectors are moved in); the engine owns them
//     until their callback has run.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace wsync::transport {

// NICs per GPU are few (EFA: 2-4); bounding them keeps RemoteMemory a POD.
inline constexpr uint32_t kMaxNics = 8;
// Largest Send payload; control messages only.
inline constexpr uint32_t kMaxControlMessage = 4096;

enum class MemoryKind { kHost, kCuda };

// One NIC's view of a registered region: the NIC's endpoint address (opaque
// provider bytes) and the remote key the region got on that NIC.
struct NicKey {
  std::string nic_address;
  uint64_t key = 0;
};

// Serializable description of a registered region, handed to peers so they
// can write into it. `address` is the base that remote offsets are added to.
struct MemoryDescriptor {
  uint64_t address = 0;
  uint64_t length = 0;
  std::vector<NicKey> nics;

  std::string Serialize() const;
  static StatusOr<MemoryDescriptor> Parse(std::string_view bytes);
  // Text form for JSON documents (a region's `descriptor` in
  // wsync.inference/v1): lowercase hex of Serialize().
  std::string ToText() const;
  static StatusOr<MemoryDescriptor> FromText(std::string_view text);
};

// The addresses of all NICs of one engine (one DomainGroup), in NIC order.
struct PeerAddress {
  std::vector<std::string> nics;

  std::string Serialize() const;
  static StatusOr<PeerAddress> Parse(std::string_view bytes);
};

using PeerId = uint32_t;

// A peer's region as this engine resolved it (Engine::Import). Plain data so
// requests carry it without allocating.
struct RemoteMemory {
  PeerId peer = 0;
  uint64_t address = 0;
  uint64_t length = 0;
  uint32_t num_nics = 0;
  std::array<uint64_t, kMaxNics> keys{};
};

// Local handle of registered memory. Destroying it deregisters (blocking).
class MemoryRegion {
 public:
  virtual ~MemoryRegion() = default;
  virtual void* data() const = 0;
  virtual uint64_t length() const = 0;
  virtual MemoryKind kind() const = 0;
  virtual const MemoryDescriptor& descriptor() const = 0;
};

using Callback = std::function<void(const Status&)>;
using RecvCallback = std::function<void(StatusOr<std::string>)>;
using Clock = std::chrono::steady_clock;

// One contiguous write. With an immediate, the receiver sees
// Engine::ArrivalsPerWrite(length) arrivals of it (a large write is split
// across NICs and every piece carries the immediate, since pieces may land
// in any order).
struct SingleWrite {
  const MemoryRegion* src = nullptr;
  uint64_t src_offset = 0;
  RemoteMemory dst;
  uint64_t dst_offset = 0;
  uint64_t length = 0;
  std::optional<uint32_t> imm;
};

// Page i of a paged write goes from src.offset + src.indices[i] * src.stride
// to dst.offset + dst.indices[i] * dst.stride, page_length bytes. Pages are
// spread over the NICs and, where the provider takes several iovecs per
// write, gathered a few per operation. With an immediate every operation
// carries it: the receiver expects Engine::ArrivalsPerPagedWrite(pages).
struct PageSet {
  std::vector<uint32_t> indices;
  uint64_t stride = 0;
  uint64_t offset = 0;
};
struct PagedWrite {
  const MemoryRegion* src = nullptr;
  PageSet src_pages;
  RemoteMemory dst;
  PageSet dst_pages;
  uint64_t page_length = 0;
  std::optional<uint32_t> imm;
};

// Slices of one source region to a group of peers; with an immediate each
// target counts one arrival per slice addressed to it.
struct ScatterSlice {
  RemoteMemory dst;
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t length = 0;
};
struct ScatterWrite {
  const MemoryRegion* src = nullptr;
  std::vector<ScatterSlice> slices;
  std::optional<uint32_t> imm;
};

// A zero-byte write-with-immediate to each peer (at a region the peer
// registered, so the target descriptor is valid, as EFA requires).
struct BarrierWrite {
  std::vector<RemoteMemory> peers;
  uint32_t imm = 0;
};

// What an engine can do, known when it starts (Mooncake-style), so callers
// ask instead of learning it from a failed call.
struct Capabilities {
  // Register(kCuda) works: the engine was created for device memory and the
  // library's CUDA interface came up (built with CUDA, a driver present).
  bool cuda_memory = false;
  // Why cuda_memory is false although the engine was asked for it; empty
  // otherwise. One sentence, for the error that refuses device tensors.
  std::string cuda_memory_note;
  // Write-with-immediate counted at the receiver: the completion signal
  // every version relies on. Engines without it refuse to start.
  bool remote_cq_data = true;
  // The transport library and version, e.g. "libfabric 1.17".
  std::string library;
  // A known weakness of this library and provider that users should hear
  // of at start (one sentence; empty if none), e.g. shm before libfabric 2.
  std::string caveat;
};

class Engine {
 public:
  virtual ~Engine() = default;

  virtual const Capabilities& capabilities() const = 0;

  virtual const std::string& provider() const = 0;
  virtual uint32_t num_nics() const = 0;
  virtual const PeerAddress& local_address() const = 0;
  // One line for logs: provider, NICs, where the worker runs.
  virtual std::string Describe() const = 0;

  // Registers [data, data+length) on every NIC of this engine. `device` is
  // the CUDA ordinal for MemoryKind::kCuda.
  virtual StatusOr<std::unique_ptr<MemoryRegion>> Register(
      void* data, uint64_t length, MemoryKind kind = MemoryKind::kHost,
      int device = 0) = 0;

  // Makes a peer known (idempotent: the same address gives the same id).
  virtual StatusOr<PeerId> AddPeer(const PeerAddress& address) = 0;

  // Resolves a peer's descriptor, adding the peer if needed. Refuses one
  // whose NIC count differs from ours (all peers use the same count).
  virtual StatusOr<RemoteMemory> Import(const MemoryDescriptor& descriptor) = 0;

  // Number of arrivals a SingleWrite of `length` bytes with an immediate
  // produces at the receiver. Same value on every engine built with the
  // same NIC count and split threshold.
  virtual uint32_t ArrivalsPerWrite(uint64_t length) const = 0;
  // Likewise for a PagedWrite of `pages` pages.
  virtual uint32_t ArrivalsPerPagedWrite(uint32_t pages) const = 0;

  virtual Status Write(SingleWrite request, Callback done) = 0;
  virtual Status WritePaged(PagedWrite request, Callback done) = 0;
  virtual Status Scatter(ScatterWrite request, Callback done) = 0;
  virtual Status Barrier(BarrierWrite request, Callback done) = 0;

  // Small two-sided messages (at most kMaxControlMessage bytes). Messages
  // that arrive before a Recv is pending are kept, in arrival order.
  // A Recv still unmatched at `deadline` ends with DEADLINE_EXCEEDED.
  virtual Status Send(PeerId peer, std::string message, Callback done) = 0;
  virtual Status Recv(RecvCallback done, Clock::time_point deadline = Clock::time_point::max()) = 0;

  // Fires `done` exactly once: OK as soon as `count` arrivals of `imm` have
  // been seen (arrivals before the call count too; extra arrivals carry over
  // to the next Expect of the same imm), or DEADLINE_EXCEEDED at `deadline`.
  // One pending Expect per imm at a time.
  virtual Status Expect(uint32_t imm, uint32_t count, Callback done,
                        Clock::time_point deadline = Clock::time_point::max()) = 0;
};

}  // namespace wsync::transport
