#include "demo/synthetic.h"

#include <cstring>

#include "pipeline/fp8.h"

namespace wsync::demo {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t NameHash(std::string_view name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char c : name) {
    h ^= static_cast<uint8_t>(c);
    h *= 1099511628211ull;
  }
  return h;
}

uint16_t SyntheticBf16(uint64_t name_hash, uint64_t flat_index, int64_t row, uint64_t version) {
  const uint64_t u = SplitMix64(name_hash ^ (flat_index * 0xD1B54A32D192ED03ull) ^ (version * 0x8CB92BA72F3D8DD7ull));
  const float unit = static_cast<float>(u >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;  // [-1, 1)
  static constexpr float kRowScale[5] = {0.25f, 0.5f, 1.0f, 2.0f, 4.0f};
  return Fp32ToBf16(unit * kRowScale[row % 5] * 0.05f);
}

void FillSyntheticBox(std::string_view name, const Shape& global_shape, const Box& box, uint64_t version,
                      uint16_t* out) {
  const uint64_t h = NameHash(name);
  const int n = box.ndim;
  if (n == 0) return;
  std::vector<int64_t> stride(n, 1);
  for (int d = n - 2; d >= 0; --d) stride[d] = stride[d + 1] * global_shape[d + 1];
  const int64_t total = box.NumElements();
  if (total == 0) return;
  std::vector<int64_t> idx(n, 0);  // position inside the box
  const int row_dim = n >= 2 ? n - 2 : 0;
  for (int64_t k = 0; k < total; ++k) {
    uint64_t flat = 0;
    for (int d = 0; d < n; ++d) flat += static_cast<uint64_t>((box.offset[d] + idx[d]) * stride[d]);
    out[k] = SyntheticBf16(h, flat, n >= 2 ? box.offset[row_dim] + idx[row_dim] : 0, version);
    for (int d = n - 1; d >= 0; --d) {
      if (++idx[d] < box.size[d]) break;
      idx[d] = 0;
    }
  }
}

std::vector<uint16_t> SyntheticTensor(std::string_view name, const Shape& global_shape, uint64_t version) {
  Box box;
  box.ndim = static_cast<int8_t>(global_shape.size());
  for (size_t d = 0; d < global_shape.size(); ++d) box.size[d] = global_shape[d];
  std::vector<uint16_t> out(static_cast<size_t>(box.NumElements()));
  FillSyntheticBox(name, global_shape, box, version, out.data());
  return out;
}

}  // namespace wsync::demo
