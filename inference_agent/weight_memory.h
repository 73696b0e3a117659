// WeightMemory: the memory an InferenceAgent registers and the version words
// it moves, whoever owns them.
//
// Two owners today: the sidecar's WeightStore (shared memory an engine maps
// by name; weight_store.h), and an engine's own tensors registered in place
// by the Python binding (python/src/inference_binding.cc), whose version
// words live in the engine's process. The agent only ever calls the methods
// below; it never learns which one it has.
//
// Version words: MarkComplete(v) is called only once every write of v has
// landed, and is a release store; complete_version() is an acquire load, so
// an engine that sees v there sees v's bytes. Neither word moves backwards.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "inference_agent/weight_store.h"
#include "transport/engine.h"

namespace wsync::inference {

class WeightMemory {
 public:
  struct Region {
    std::string id;  // the region id of the rank's wsync.inference/v1 entry
    uint8_t* data = nullptr;
    uint64_t size = 0;
    transport::MemoryKind kind = transport::MemoryKind::kHost;
    int device = 0;  // CUDA ordinal for kCuda
  };

  virtual ~WeightMemory() = default;
  // For logs: the shared-memory name, or "<n> tensors of process <pid>".
  virtual std::string name() const = 0;
  virtual const std::vector<Region>& regions() const = 0;
  virtual uint64_t complete_version() const = 0;
  virtual uint64_t failed_version() const = 0;
  // False (and nothing moves) for a v older than the current complete one.
  virtual bool MarkComplete(uint64_t v) = 0;
  virtual void MarkFailed(uint64_t v) = 0;
  // Shadow mode, just before v is copied in: until MarkComplete(v) the
  // weights are neither the last complete version nor v. By default the
  // failed word says so (an engine process that outlives an agent killed
  // mid-copy sees them as mixed); the weight store also says that v is being
  // copied (weight_store_format.h), so an engine waiting for v waits on; an
  // owner whose engine shares the agent's process (it dies with it) need not.
  virtual void MarkCommitting(uint64_t v) { MarkFailed(v); }
  // Shadow mode: v failed without touching these weights, which stay at the
  // last complete version. By default nothing changes (the failed word would
  // tell the engine they are mixed); an owner with waiters wakes them.
  virtual void MarkNotApplied(uint64_t) {}
  // Copies `bytes` at `offset` of region `r` (one of regions()) to the host,
  // for checksums. Host regions are read in place; an owner of device
  // memory overrides this (Unimplemented otherwise).
  virtual Status Read(const Region& r, uint64_t offset, uint64_t bytes, uint8_t* out) const;
  // Checksum64 (common/checksum.h) of each range, for Verify: out[i] is
  // ranges[i]'s. By default host regions are hashed in place and device
  // regions read back with Read a piece at a time; an owner of device
  // memory may hash them where they are (the torch binding does, by
  // common/checksum_cuda.h's kernels).
  struct Range {
    const Region* region = nullptr;  // one of regions(), or of the shadow's
    uint64_t offset = 0;
    uint64_t bytes = 0;
  };
  virtual Status Checksums(const std::vector<Range>& ranges, uint64_t* out) const;

  // Delta versions (InferenceAgentOptions::deltas) in device regions. The
  // inbox of device region `r` (delta/inbox.h): `bytes` of zeroed memory on
  // r's device, which the agent registers with the engine as it registers r
  // (FI_HMEM), given back by FreeInbox. Unimplemented by default: the region
  // then gets no inbox and takes every write whole.
  virtual StatusOr<uint8_t*> AllocateInbox(const Region& r, uint64_t bytes);
  virtual void FreeInbox(const Region& r, uint8_t* inbox) { (void)r, (void)inbox; }
  // delta::Apply on r's device (delta/codec_cuda.h): the delta at `delta`
  // (`delta_bytes` of r's inbox) onto `target` (`size` bytes inside r, of
  // the landing memory), checked whole before a byte changes, its errors
  // naming `what`; returns once the bytes are in place. Unimplemented by
  // default.
  virtual Status ApplyDelta(const Region& r, const uint8_t* delta, uint64_t delta_bytes, uint8_t* target,
                            uint64_t size, const char* what) const;
};

// Shadow mode: memory of the same regions (ids, sizes) where the writes
// land instead of the engine's, and the copy that moves a complete version's
// bytes from it into the engine's weights (InferenceAgent::Commit), so a
// version that fails never touches them. A shadow region is of the live
// one's kind, or host memory for a device region: host staging, for a
// transport that cannot register device memory.
class ShadowMemory {
 public:
  virtual ~ShadowMemory() = default;
  virtual const std::vector<WeightMemory::Region>& regions() const = 0;
  // Bytes [offset, offset + bytes) of shadow region `from` into live region
  // `to` (the same id); may be asynchronous until Finish.
  virtual Status CopyOut(const WeightMemory::Region& from, const WeightMemory::Region& to, uint64_t offset,
                         uint64_t bytes) = 0;
  // Returns once every CopyOut issued is in the live memory, visible to
  // the engine's reads.
  virtual Status Finish() = 0;
};

// Host memory of `live`'s regions (private anonymous mappings), copied out
// with memcpy. InvalidArgument for device regions (their owner brings its own).
StatusOr<std::unique_ptr<ShadowMemory>> MakeHostShadow(const WeightMemory& live);

// The sidecar's WeightMemory: `store`'s regions (host memory) and the
// version words in its shared header, which the engine process reads.
std::unique_ptr<WeightMemory> MakeShmWeightMemory(WeightStore store);

}  // namespace wsync::inference
