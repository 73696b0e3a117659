#include "pipeline/box_pack.h"

#include <cstring>

#include "pipeline/fp8.h"

namespace wsync {
namespace {

void CastRow(const uint8_t* src, DType from, uint8_t* dst, DType to, int64_t n) {
  if (from == to) {
    std::memcpy(dst, src, static_cast<size_t>(n * DTypeSize(from)));
    return;
  }
  if (from == DType::kBF16 && to == DType::kFP32) {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t b;
      std::memcpy(&b, src + 2 * i, 2);
      const float f = Bf16ToFp32(b);
      std::memcpy(dst + 4 * i, &f, 4);
    }
    return;
  }
  // fp32 -> bf16 (CanCast admits nothing else).
  for (int64_t i = 0; i < n; ++i) {
    float f;
    std::memcpy(&f, src + 4 * i, 4);
    const uint16_t b = Fp32ToBf16(f);
    std::memcpy(dst + 2 * i, &b, 2);
  }
}

}  // namespace

bool CanCast(DType from, DType to) {
  if (from == to) return true;
  return (from == DType::kBF16 && to == DType::kFP32) || (from == DType::kFP32 && to == DType::kBF16);
}

bool BoxWithin(const Box& inner, const Box& outer) {
  if (inner.ndim != outer.ndim) return false;
  for (int d = 0; d < inner.ndim; ++d) {
    if (inner.size[d] < 0 || inner.offset[d] < outer.offset[d] ||
        inner.offset[d] + inner.size[d] > outer.offset[d] + outer.size[d]) {
      return false;
    }
  }
  return true;
}

bool ContiguousIn(const Box& box, const Box& held, int64_t* first_element) {
  const int n = box.ndim;
  if (n != held.ndim || box.NumElements() == 0 || !BoxWithin(box, held)) return false;
  int outer = 0;  // the outermost dim longer than 1; those before it are single slices
  while (outer < n - 1 && box.size[outer] == 1) ++outer;
  for (int d = outer + 1; d < n; ++d) {
    if (box.size[d] != held.size[d]) return false;
  }
  int64_t at = 0, stride = 1;
  for (int d = n - 1; d >= 0; --d) {
    at += (box.offset[d] - held.offset[d]) * stride;
    stride *= held.size[d];
  }
  *first_element = at;
  return true;
}

bool AsPitchedRuns(const Box& box, const Box& held, PitchedRuns* out) {
  const int n = box.ndim;
  if (n != held.ndim || box.NumElements() == 0 || !BoxWithin(box, held)) return false;
  // Levels from the innermost out, as (count, pitch) with the run first; a
  // dim merges into the level inside it when that level spans its stride.
  int64_t count[3] = {1, 1, 1}, pitch[3] = {1, 0, 0};
  int levels = 1;
  int64_t stride = 1, first = 0;
  for (int d = n - 1; d >= 0; --d) {
    first += (box.offset[d] - held.offset[d]) * stride;
    if (box.size[d] != 1) {
      int top = levels - 1;
      if (count[top] * pitch[top] == stride || (top == 0 && count[0] == 1)) {
        if (top == 0 && count[0] == 1) pitch[0] = stride;
        count[top] *= box.size[d];
      } else if (levels == 3) {
        return false;
      } else {
        count[levels] = box.size[d];
        pitch[levels] = stride;
        ++levels;
      }
    }
    stride *= held.size[d];
  }
  if (pitch[0] != 1) {
    // The innermost cut dim is not the last (every later dim has size 1):
    // runs of one element. Still exact, just not fast.
    if (levels == 3) return false;
    count[2] = count[1];
    pitch[2] = pitch[1];
    count[1] = count[0];
    pitch[1] = pitch[0];
    count[0] = 1;
    pitch[0] = 1;
  }
  *out = PitchedRuns{first, count[0], count[1], pitch[1], count[2], pitch[2]};
  return true;
}

void PackBox(const uint8_t* data, const Box& held, DType from, const Box& box, DType to, uint8_t* out) {
  const int n = box.ndim;
  if (box.NumElements() == 0) return;
  if (n == 0) {
    CastRow(data, from, out, to, 1);
    return;
  }
  // Element strides of the held buffer.
  int64_t stride[kMaxDims];
  stride[n - 1] = 1;
  for (int d = n - 2; d >= 0; --d) stride[d] = stride[d + 1] * held.size[d + 1];
  const int64_t row = box.size[n - 1];
  const int64_t in_elem = DTypeSize(from), out_elem = DTypeSize(to);
  int64_t at[kMaxDims] = {};  // odometer over the box's outer dims
  while (true) {
    int64_t src = 0;
    for (int d = 0; d < n; ++d) src += (box.offset[d] - held.offset[d] + (d < n - 1 ? at[d] : 0)) * stride[d];
    CastRow(data + src * in_elem, from, out, to, row);
    out += row * out_elem;
    int d = n - 2;
    for (; d >= 0; --d) {
      if (++at[d] < box.size[d]) break;
      at[d] = 0;
    }
    if (d < 0) break;
  }
}

Box HeldScaleGrid(const Box& held) {
  Box grid = held;
  const int n = held.ndim;
  for (int d = n - 2; d < n; ++d) {  // held starts on a block edge (the executor checks)
    grid.offset[d] = held.offset[d] / kFp8BlockSize;
    grid.size[d] = Fp8BlockCount(held.size[d]);
  }
  return grid;
}

Status QuantizeHeld(const uint16_t* data, const Box& held, uint8_t* q, float* scales) {
  const int n = held.ndim;
  const int64_t rows = held.size[n - 2], cols = held.size[n - 1];
  int64_t matrices = 1;
  for (int d = 0; d < n - 2; ++d) matrices *= held.size[d];
  const int64_t grid = Fp8BlockCount(rows) * Fp8BlockCount(cols);
  for (int64_t m = 0; m < matrices; ++m) {
    const Bf16MatrixView view{data + m * rows * cols, rows, cols, cols};
    const MatrixBox all{0, rows, 0, cols};
    WSYNC_RETURN_IF_ERROR(QuantizeFp8BlocksInBox(view, all, q + m * rows * cols, cols,
                                                 scales + m * grid, Fp8BlockCount(cols)));
  }
  return Status::Ok();
}

}  // namespace wsync
