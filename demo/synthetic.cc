#include "demo/synthetic.h"

namespace wsync::demo {

uint64_t NameHash(std::string_view name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char c : name) {
    h ^= static_cast<uint8_t>(c);
    h *= 1099511628211ull;
  }
  return h;
}

void FillSyntheticBox(std::string_view name, const Shape& global_shape, const Box& box, uint64_t version,
                      uint16_t* out, uint32_t drift) {
  using namespace synthetic_detail;
  const uint64_t h = NameHash(name);
  const uint64_t version_key = version * kVersionMul;
  const int n = box.ndim;
  if (n == 0) return;
  const int64_t total = box.NumElements();
  if (total == 0) return;
  std::vector<int64_t> stride(n, 1);
  for (int d = n - 2; d >= 0; --d) stride[d] = stride[d + 1] * global_shape[d + 1];
  // One box row (along the last dim) at a time: its global indices are
  // consecutive and it lies in a single row of the second-to-last dim.
  const int64_t cols = box.size[n - 1];
  const int64_t lines = total / cols;
  std::vector<int64_t> idx(n, 0);  // position inside the box, last dim unused
  for (int64_t line = 0; line < lines; ++line) {
    uint64_t base = static_cast<uint64_t>(box.offset[n - 1]);
    for (int d = 0; d < n - 1; ++d) base += static_cast<uint64_t>((box.offset[d] + idx[d]) * stride[d]);
    const float row_scale = n >= 2 ? kRowScale[(box.offset[n - 2] + idx[n - 2]) % 5] : kRowScale[0];
    uint16_t* dst = out + line * cols;
    if (drift <= 1) {
      for (int64_t c = 0; c < cols; ++c) {
        dst[c] = RoundToBf16(SyntheticValue(h, base + static_cast<uint64_t>(c), row_scale, version_key));
      }
    } else {
      for (int64_t c = 0; c < cols; ++c) {
        const uint64_t flat = base + static_cast<uint64_t>(c);
        dst[c] = RoundToBf16(SyntheticValue(h, flat, row_scale, LastChange(h, flat, version, drift) * kVersionMul));
      }
    }
    for (int d = n - 2; d >= 0; --d) {
      if (++idx[d] < box.size[d]) break;
      idx[d] = 0;
    }
  }
}

std::vector<uint16_t> SyntheticTensor(std::string_view name, const Shape& global_shape, uint64_t version,
                                      uint32_t drift) {
  Box box;
  box.ndim = static_cast<int8_t>(global_shape.size());
  for (size_t d = 0; d < global_shape.size(); ++d) box.size[d] = global_shape[d];
  std::vector<uint16_t> out(static_cast<size_t>(box.NumElements()));
  FillSyntheticBox(name, global_shape, box, version, out.data(), drift);
  return out;
}

}  // namespace wsync::demo
