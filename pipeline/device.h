// DeviceOps: where the executor's temporary memory lives and how bytes move
// there. Without one (ExecutorOptions::device == nullptr) everything is host
// memory and the stages are the CPU code of box_pack.h. With one, the arena
// is device memory registered as such with the engine, and the copy, pack
// and quantize stages are the device's; every call is ordered on one stream
// of the device, and Synchronize() waits for it before the engine reads the
// bytes (a write is posted only after its staging is final) and before the
// trainer hears ReadsDone (its shards may change after that).
//
// The executor stays free of any GPU API: the torch binding implements this
// over ATen on the trainer's own CUDA device (python/src/torch_device.cc).
// Implementations must give the same bytes as the CPU stages (box_pack.h,
// the fp8 reference): the GPU tests compare against plain torch on the CPU.
//
// Host staging (ExecutorOptions::stage_through_host): where the engine
// cannot register device memory (a libfabric without FI_HMEM), the arena
// gets a mirror in pinned host memory, registered in its place; every
// write's bytes are copied device-to-host into the mirror at the same
// offset before the wait that precedes posting.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "common/status.h"
#include "delta/codec.h"
#include "routing/dtype.h"
#include "routing/routing_table.h"
#include "transport/engine.h"

namespace wsync {

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;

  // "cuda:0": for logs and errors.
  virtual std::string name() const = 0;
  // What the engine is told the memory is, and its device ordinal.
  virtual transport::MemoryKind kind() const = 0;
  virtual int ordinal() const = 0;

  // Device memory for the arena (at least `bytes`, 256-byte aligned).
  virtual StatusOr<void*> Allocate(uint64_t bytes) = 0;
  virtual void Free(void* p) = 0;

  // `src` may be host or device memory (the trainer's shards live either on
  // the device or, offloaded, in pinned host memory).
  virtual Status Copy(void* dst, const void* src, uint64_t bytes) = 0;
  virtual Status Zero(void* dst, uint64_t bytes) = 0;
  // `rows` runs of `width` bytes, run i from src + i * src_pitch to
  // dst + i * dst_pitch (cudaMemcpy2D's shape): the planned exchange's
  // pieces of stacked tensors, out of the shard (host or device memory,
  // as Copy) and into the held tensor (device memory).
  virtual Status Copy2D(void* dst, uint64_t dst_pitch, const void* src, uint64_t src_pitch, uint64_t width,
                        uint64_t rows) = 0;
  // box_pack.h's PackBox, on device memory.
  virtual Status PackBox(const uint8_t* data, const Box& held, DType from, const Box& box, DType to,
                         uint8_t* out) = 0;
  // Whether QuantizeHeld may read `p` where it is: this device's memory, or
  // host memory it maps. Else the executor copies the shard over first.
  virtual bool CanRead(const void* p) = 0;
  // box_pack.h's QuantizeHeld, on device memory: InvalidArgument for NaN/Inf.
  virtual Status QuantizeHeld(const uint16_t* data, const Box& held, uint8_t* q, float* scales) = 0;
  // Returns once everything issued above has finished, and sets
  // `nonfinite` to one entry per QuantizeHeld that returned OK since the
  // last Synchronize, in issue order: whether it met a NaN or an infinity
  // (its codes must not be sent).
  virtual Status Synchronize(std::vector<bool>* nonfinite) = 0;
  // Copies `bytes` of device memory to the host and returns once they are
  // there; called only after Synchronize (for checksums of written bytes,
  // and by collectives that go through host memory, staged_group.h).
  virtual Status ReadBack(void* host, const void* src, uint64_t bytes) = 0;
  // Checksum64 (common/checksum.h) of each of `count` ranges of device
  // memory, ordered after everything issued above: hashes[i] holds range
  // i's once the next Synchronize has returned (the ranges must stay
  // unchanged until then). By default each range is read back and hashed on
  // the host, at once; a device that can hashes them where they are, while
  // the writes posted meanwhile are in flight (issue #34: a host hash of
  // every written byte cost 200 times the update).
  virtual Status Checksums(const ChecksumPiece* pieces, size_t count, uint64_t* hashes) {
    constexpr uint64_t kPiece = 16ull << 20;
    std::vector<uint8_t> back;
    for (size_t i = 0; i < count; ++i) {
      Checksum64Stream h;
      const auto* p = static_cast<const uint8_t*>(pieces[i].data);
      for (uint64_t done = 0; done < pieces[i].bytes;) {
        const uint64_t n = std::min(kPiece, pieces[i].bytes - done);
        back.resize(static_cast<size_t>(n));
        WSYNC_RETURN_IF_ERROR(ReadBack(back.data(), p + done, n));
        h.Update(back.data(), n);
        done += n;
      }
      hashes[i] = h.Final();
    }
    return Status::Ok();
  }
  // Host memory into device memory, after everything issued above, and
  // returns once the bytes are there: the caller may reuse `host` at once
  // (staged_group.h, whose host buffers serve the next collective).
  virtual Status CopyFromHost(void* dst, const void* host, uint64_t bytes) = 0;

  // Delta versions (ExecutorOptions::deltas, docs/DELTAS.md): whether this
  // device implements EncodeDelta. Without it the executor keeps no copies
  // on the device and every write goes whole.
  virtual bool EncodesDeltas() const { return false; }
  // delta/codec.h's EncodeAndAdvance on device memory (`base`: a copy the
  // executor keeps in memory Allocate gave; `next` and `out`: the arena;
  // all 16-byte aligned), ordered after everything issued above. Returns
  // once the result is known (the delta's length decides where the write
  // goes), with `base` advanced to `next` either way.
  virtual StatusOr<delta::Encoded> EncodeDelta(uint8_t* base, const uint8_t* next, uint64_t size,
                                               uint32_t elem_bytes, uint8_t* out, uint64_t capacity) {
    (void)base, (void)next, (void)size, (void)elem_bytes, (void)out, (void)capacity;
    return Unimplemented(name() + ": no delta encode on this device");
  }

  // Host staging. Page-locked host memory (the arena's mirror), so that
  // copies into it run asynchronously; freed by FreeHost.
  virtual StatusOr<void*> AllocateHost(uint64_t bytes) = 0;
  virtual void FreeHost(void* p) = 0;
  // Device memory into host memory AllocateHost gave, ordered on the stream
  // like every stage above: the bytes are there once Synchronize returns.
  virtual Status CopyToHost(void* host, const void* src, uint64_t bytes) = 0;
};

}  // namespace wsync
