#include "pipeline/fp8.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>

namespace wsync {
namespace {

constexpr uint32_t kFp32AbsMask = 0x7FFFFFFFu;
constexpr uint32_t kFp32Inf = 0x7F800000u;
// 448 is 1.75 * 2^8: exponent field 135, mantissa 0x600000.
constexpr uint32_t kFp32Bits448 = 0x43E00000u;
// 2^-6, the smallest normal e4m3 value: exponent field 121.
constexpr uint32_t kFp32BitsMinNormalE4M3 = 121u << 23;

std::string Hex(uint32_t v, int digits) {
  static const char* kDigits = "0123456789abcdef";
  std::string s = "0x";
  for (int i = digits - 1; i >= 0; --i) s += kDigits[(v >> (4 * i)) & 0xF];
  return s;
}

Status ValidateView(const Bf16MatrixView& src) {
  if (src.rows < 0 || src.cols < 0) {
    return InvalidArgument("fp8 quantize: negative shape [" + std::to_string(src.rows) + ", " +
                           std::to_string(src.cols) + "]");
  }
  if (src.row_stride < src.cols) {
    return InvalidArgument("fp8 quantize: row stride " + std::to_string(src.row_stride) +
                           " is smaller than the column count " + std::to_string(src.cols));
  }
  if (src.data == nullptr && src.rows > 0 && src.cols > 0) {
    return InvalidArgument("fp8 quantize: source data is null for a non-empty tensor");
  }
  return Status::Ok();
}

// Bits of a bf16 whose exponent is all ones (inf or NaN), sign dropped.
constexpr uint16_t kBf16NonFinite = 0x7F80u;

// The largest |x| of n bf16 values, as bits without the sign.
uint16_t AbsMaxBits(const uint16_t* p, int64_t n) {
  uint16_t m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max<uint16_t>(m, p[i] & 0x7FFFu);
  return m;
}

// Fp32ToE4M3(Bf16ToFp32(p[i]) / s) for n finite values, written without
// branches so that it vectorizes: the same code, bit for bit, checked on
// every finite bf16 against several scales (fp8_test.cc). The division stays
// a division (x * (1 / s) rounds differently). The quotient is finite here.
// (Not under the sanitizers: an ifunc resolver runs before their runtime is
// up, and TSan builds then crash at start.)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__) && \
    !defined(__SANITIZE_ADDRESS__)
__attribute__((target_clones("avx2", "default")))
#endif
void EncodeE4M3Run(const uint16_t* p, int64_t n, float s, uint8_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float y = std::bit_cast<float>(static_cast<uint32_t>(p[i]) << 16) / s;  // Bf16ToFp32, inlined
    const uint32_t bits = std::bit_cast<uint32_t>(y);
    const uint32_t sign = (bits >> 24) & 0x80u;
    const uint32_t abs = bits & kFp32AbsMask;
    // Normal target, as Fp32ToE4M3: rebias, round the mantissa nearest even.
    uint32_t r = abs - ((127u - 7u) << 23);
    r += 0x7FFFFu + ((r >> 20) & 1u);
    const uint32_t normal = std::min<uint32_t>(r >> 20, kE4M3MaxCode);
    // Subnormal target: round_even(|y| * 2^9), in 0..8. The product is exact;
    // adding 1.5 * 2^23 rounds it to an integer in the low mantissa bits.
    const float t = std::bit_cast<float>(abs) * 512.0f + 12582912.0f;
    const uint32_t sub = std::bit_cast<uint32_t>(t) - 0x4B400000u;
    const uint32_t is_normal = 0u - static_cast<uint32_t>(abs >= kFp32BitsMinNormalE4M3);
    const uint32_t saturate = 0u - static_cast<uint32_t>(abs >= kFp32Bits448);
    const uint32_t code = std::min<uint32_t>(((normal & is_normal) | (sub & ~is_normal)) | saturate, kE4M3MaxCode);
    out[i] = static_cast<uint8_t>(sign | code);
  }
}

std::string BoxString(const MatrixBox& b) {
  return "rows [" + std::to_string(b.row_begin) + ", " + std::to_string(b.row_end) + ") cols [" +
         std::to_string(b.col_begin) + ", " + std::to_string(b.col_end) + ")";
}

Status ValidateBox(const Bf16MatrixView& src, const MatrixBox& box) {
  const bool inside = 0 <= box.row_begin && box.row_begin <= box.row_end &&
                      box.row_end <= src.rows && 0 <= box.col_begin &&
                      box.col_begin <= box.col_end && box.col_end <= src.cols;
  if (!inside) {
    return OutOfRange("fp8 quantize: box " + BoxString(box) + " is not inside the tensor [" +
                      std::to_string(src.rows) + ", " + std::to_string(src.cols) + "]");
  }
  const bool starts_aligned =
      box.row_begin % kFp8BlockSize == 0 && box.col_begin % kFp8BlockSize == 0;
  const bool ends_aligned = (box.row_end % kFp8BlockSize == 0 || box.row_end == src.rows) &&
                            (box.col_end % kFp8BlockSize == 0 || box.col_end == src.cols);
  if (!starts_aligned || !ends_aligned) {
    return InvalidArgument("fp8 quantize: box " + BoxString(box) +
                           " cuts a 128x128 block; boxes must start on multiples of 128 and "
                           "end on one or at the tensor edge");
  }
  return Status::Ok();
}

}  // namespace

float Bf16ToFp32(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

uint16_t Fp32ToBf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & kFp32AbsMask) > kFp32Inf) return 0x7FFF;  // CUDA's canonical NaN
  // Round to nearest even on the 16 dropped bits; a carry into the exponent
  // is the correct result (up to infinity).
  const uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7FFFu + lsb) >> 16);
}

uint8_t Fp32ToE4M3(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs = bits & kFp32AbsMask;
  if (abs > kFp32Inf) return kE4M3NaNCode;  // canonical, sign dropped, as cvt.satfinite does
  if (abs >= kFp32Bits448) return sign | kE4M3MaxCode;  // saturate, incl. inf

  if (abs >= kFp32BitsMinNormalE4M3) {
    // Normal: rebias the exponent (127 -> 7) and round the 23-bit mantissa to
    // 3 bits, nearest even; a mantissa carry bumps the exponent correctly.
    uint32_t r = abs - ((127u - 7u) << 23);
    r += 0x7FFFFu + ((r >> 20) & 1u);
    const uint32_t code = r >> 20;
    return sign | static_cast<uint8_t>(std::min<uint32_t>(code, kE4M3MaxCode));
  }

  // Subnormal target: the code is round_even(|x| / 2^-9), in 0..8 (8 being
  // the smallest normal, whose code is also 8).
  const uint32_t exp_field = abs >> 23;
  const uint32_t mant = abs & 0x7FFFFFu;
  // |x| = m * 2^(e - 150) with m the 24-bit significand (fp32 subnormals have
  // no implicit bit and e = 1), so |x| / 2^-9 = m / 2^(141 - e).
  const uint32_t m = exp_field == 0 ? mant : (mant | 0x800000u);
  const uint32_t e = exp_field == 0 ? 1u : exp_field;
  const uint32_t shift = 141u - e;  // >= 21 here
  if (shift >= 32) return sign;     // |x| < 2^-33 rounds to zero
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return sign | static_cast<uint8_t>(q);
}

float E4M3ToFp32(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80u) << 24;
  const uint32_t exp = (code >> 3) & 0xFu;
  const uint32_t mant = code & 0x7u;
  if (exp == 0xF && mant == 0x7) return std::bit_cast<float>(sign | 0x7FC00000u);
  if (exp == 0) {
    // m * 2^-9 is exact in fp32.
    const float mag = static_cast<float>(mant) * 0x1p-9f;
    return sign ? -mag : mag;
  }
  return std::bit_cast<float>(sign | ((exp + 120u) << 23) | (mant << 20));
}

Status QuantizeFp8BlocksInBox(const Bf16MatrixView& src, const MatrixBox& box,
                              uint8_t* q_out, int64_t q_row_stride,
                              float* scale_out, int64_t scale_row_stride) {
  WSYNC_RETURN_IF_ERROR(ValidateView(src));
  WSYNC_RETURN_IF_ERROR(ValidateBox(src, box));
  const int64_t box_rows = box.row_end - box.row_begin;
  const int64_t box_cols = box.col_end - box.col_begin;
  const int64_t block_rows = Fp8BlockCount(box_rows);
  const int64_t block_cols = Fp8BlockCount(box_cols);
  if (box_rows == 0 || box_cols == 0) return Status::Ok();
  if (q_out == nullptr || scale_out == nullptr) {
    return InvalidArgument("fp8 quantize: null output buffer for box " + BoxString(box));
  }
  if (q_row_stride < box_cols || scale_row_stride < block_cols) {
    return InvalidArgument("fp8 quantize: output row strides (" + std::to_string(q_row_stride) +
                           " bytes, " + std::to_string(scale_row_stride) +
                           " scales) are smaller than the box (" + std::to_string(box_cols) +
                           " columns, " + std::to_string(block_cols) + " blocks)");
  }

  // Pass 1: per-block amax, rejecting non-finite input before anything is
  // written, so a failed call leaves the caller's buffers untouched. Finite
  // bf16 magnitudes order as their bits without the sign, so the amax is an
  // integer max (vectorized); a non-finite element has bits >= 0x7F80.
  std::vector<uint16_t> amax(static_cast<size_t>(block_rows * block_cols), 0);
  for (int64_t r = box.row_begin; r < box.row_end; ++r) {
    const uint16_t* row = src.data + r * src.row_stride;
    uint16_t* amax_row = amax.data() + ((r - box.row_begin) / kFp8BlockSize) * block_cols;
    uint16_t row_max = 0;
    for (int64_t b = 0; b < block_cols; ++b) {
      const int64_t c = box.col_begin + b * kFp8BlockSize;
      const uint16_t m = AbsMaxBits(row + c, std::min<int64_t>(kFp8BlockSize, box.col_end - c));
      amax_row[b] = std::max(amax_row[b], m);
      row_max = std::max(row_max, m);
    }
    if (row_max < kBf16NonFinite) continue;
    for (int64_t c = box.col_begin; c < box.col_end; ++c) {
      const uint16_t bits = row[c];
      if ((bits & 0x7FFFu) >= kBf16NonFinite) {
        return InvalidArgument("fp8 quantize: element [" + std::to_string(r) + ", " +
                               std::to_string(c) + "] is " + ((bits & 0x7Fu) ? "NaN" : "infinite") +
                               " (bf16 " + Hex(bits, 4) +
                               "); refusing to send non-finite weights");
      }
    }
  }

  // Pass 2: scales, then elements, a block-wide run at a time.
  std::vector<float> scale(amax.size());
  for (size_t i = 0; i < amax.size(); ++i) {
    scale[i] = amax[i] == 0 ? 1.0f : Bf16ToFp32(amax[i]) / kE4M3Max;
  }
  for (int64_t br = 0; br < block_rows; ++br) {
    std::copy_n(scale.data() + br * block_cols, block_cols, scale_out + br * scale_row_stride);
  }
  for (int64_t r = box.row_begin; r < box.row_end; ++r) {
    const uint16_t* row = src.data + r * src.row_stride;
    const float* scale_row = scale.data() + ((r - box.row_begin) / kFp8BlockSize) * block_cols;
    uint8_t* q_row = q_out + (r - box.row_begin) * q_row_stride;
    for (int64_t b = 0; b < block_cols; ++b) {
      const int64_t c = box.col_begin + b * kFp8BlockSize;
      EncodeE4M3Run(row + c, std::min<int64_t>(kFp8BlockSize, box.col_end - c), scale_row[b],
                    q_row + (c - box.col_begin));
    }
  }
  return Status::Ok();
}

StatusOr<Fp8BlockTensor> QuantizeFp8Blocks(const Bf16MatrixView& src) {
  WSYNC_RETURN_IF_ERROR(ValidateView(src));
  Fp8BlockTensor out;
  out.rows = src.rows;
  out.cols = src.cols;
  out.q.resize(static_cast<size_t>(src.rows * src.cols));
  out.scale_inv.resize(static_cast<size_t>(Fp8BlockCount(src.rows) * Fp8BlockCount(src.cols)));
  const MatrixBox all{0, src.rows, 0, src.cols};
  WSYNC_RETURN_IF_ERROR(QuantizeFp8BlocksInBox(src, all, out.q.data(), src.cols,
                                               out.scale_inv.data(), Fp8BlockCount(src.cols)));
  return out;
}

std::vector<float> DequantizeFp8Blocks(const Fp8BlockTensor& t) {
  std::vector<float> out(t.q.size());
  const int64_t block_cols = Fp8BlockCount(t.cols);
  for (int64_t r = 0; r < t.rows; ++r) {
    for (int64_t c = 0; c < t.cols; ++c) {
      const float s = t.scale_inv[(r / kFp8BlockSize) * block_cols + c / kFp8BlockSize];
      out[r * t.cols + c] = E4M3ToFp32(t.q[r * t.cols + c]) * s;
    }
  }
  return out;
}

}  // namespace wsync
