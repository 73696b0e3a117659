// The fuse/convert/quantize half of the trainer pipeline on CPU: cutting a
// write's box out of a held (unsharded) tensor into contiguous staging bytes,
// with a dtype cast, and fp8 block quantization of a held tensor.
//
// "Fuse" needs no kernel of its own here: the planner already resolved every
// fused destination (qkv, gate_up, stacked experts) into writes of source
// boxes at destination offsets, so each write only has to pack its box
// row-major. Called by the executor (pipeline/executor.h); the GPU kernels
// written later must give the same bytes.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "routing/dtype.h"
#include "routing/routing_table.h"

namespace wsync {

// Casts the write stage does without a quantize rule: identity, bf16 <-> fp32.
bool CanCast(DType from, DType to);

// True if `inner` lies within `outer` (same ndim).
bool BoxWithin(const Box& inner, const Box& outer);

// Whether `box` of a row-major buffer holding exactly `held` is one
// contiguous run of it (every dim inside the outermost one longer than 1 is
// whole), and if so where the run starts, in elements. A write of such a box
// needs no packing. False for an empty box.
bool ContiguousIn(const Box& box, const Box& held, int64_t* first_element);

// `box` of a row-major buffer holding exactly `held`, as at most
// `planes` x `rows` runs of `run` contiguous elements: run r of plane p
// starts at element first + p * plane_pitch + r * pitch. The shape a
// pitched 2D copy (cudaMemcpy2D) takes, looped over planes.
struct PitchedRuns {
  int64_t first = 0;
  int64_t run = 0;
  int64_t rows = 1;
  int64_t pitch = 0;
  int64_t planes = 1;
  int64_t plane_pitch = 0;
};
// False for an empty box, or one that needs more than three levels (a box
// cut in three or more non-adjacent dims).
bool AsPitchedRuns(const Box& box, const Box& held, PitchedRuns* out);

// Copies `box` of a tensor whose buffer `data` holds exactly the region
// `held` (row-major, dtype `from`) to `out`, row-major, as dtype `to`. The
// box must lie within `held` and the cast must pass CanCast.
void PackBox(const uint8_t* data, const Box& held, DType from, const Box& box, DType to, uint8_t* out);

// The block grid of the fp8 scales of a held tensor: the leading dims as
// held, the last two counted in 128-blocks (quantization needs whole blocks:
// `held` starts on a block edge and ends on one or at the tensor's end,
// which the planner guarantees and the executor checks).
Box HeldScaleGrid(const Box& held);

// Quantizes a held bf16 tensor (ndim >= 2, every leading index a separate
// matrix, e.g. one expert of a stacked tensor) to e4m3 bytes `q` (same
// element order) and fp32 block scales over HeldScaleGrid(held), with the
// pipeline/fp8.h reference kernel. InvalidArgument for NaN/Inf inputs.
Status QuantizeHeld(const uint16_t* data, const Box& held, uint8_t* q, float* scales);

}  // namespace wsync
