// Reference CPU kernels for the fp8 quantize stage of the trainer pipeline.
//
// The trainer agent quantizes each bf16 source tensor to fp8 e4m3fn in
// 128x128 blocks before writing it into an inference engine that stores
// DeepSeek-V3-style block-fp8 weights (`weight` + `weight_scale_inv`, see the
// `quantize` section of docs/SCHEMA.md). The GPU kernel written later must
// produce the same bytes as these functions, bit for bit; the tests pin them
// against independent brute-force paths. Callers: the pipeline's quantize
// stage (CPU fallback, and the oracle for the GPU kernel's tests).
//
// Conventions (every one is a choice the GPU kernel must copy):
//  - bf16 -> fp32 is exact (shift by 16). fp32 -> bf16 rounds to nearest even;
//    every NaN becomes 0x7FFF, as CUDA's __float2bfloat16_rn does (torch's
//    CPU c10::BFloat16 gives 0x7FC0 instead).
//  - e4m3fn (OCP "float8_e4m3fn"): 1 sign, 4 exponent (bias 7), 3 mantissa
//    bits; no infinities; S.1111.111 is NaN; largest finite 448; smallest
//    subnormal 2^-9. Encoding rounds to nearest, ties to even, and saturates:
//    any |x| > 448 (including infinity) becomes +-448. Every NaN becomes
//    0x7F (0.1111.111, sign dropped). This is CUDA's __nv_cvt_float_to_fp8(x,
//    __NV_SATFINITE, __NV_E4M3) and Triton's fp32 -> tl.float8e4nv cast:
//    tests/pipeline/gpu/ checked both against these functions for all 2^32
//    fp32 inputs on an H200. torch's `.to(torch.float8_e4m3fn)` agrees on
//    |x| < 480 but keeps NaN's sign and turns |x| >= 480 into NaN instead
//    of saturating; quantized values never reach 480 (below).
//  - Block quantization (DeepSeek-V3 inference/kernel.py act_quant and the
//    docs/SCHEMA.md formula): per 128x128 block (edge blocks partial, no
//    padding taken into the max),
//        amax      = max |x| over the block, in fp32 (exact: bf16 widens exactly)
//        scale_inv = amax / 448.0f              (IEEE fp32 division, RN)
//        q         = e4m3(x / scale_inv)        (IEEE fp32 division, RN)
//    and dequantization is e4m3_to_fp32(q) * scale_inv in fp32 (DeepSeek-V3
//    weight_dequant). The GPU kernel must use correctly rounded division
//    (__fdiv_rn, not --use_fast_math) and must not flush subnormals: a block
//    with a tiny amax has a subnormal scale_inv, whose reciprocal overflows
//    fp32, so x * (1 / scale_inv) would saturate the whole block.
//  - An all-zero block (amax == 0) gets scale_inv = 1.0f, so q = e4m3(x) =
//    +-0 and dequantization gives 0. DeepSeek's act_quant would divide 0/0
//    there; vLLM/DeepGEMM's per_block_cast_to_fp8 clamps amax to >= 1e-4,
//    which would also change the scale of small nonzero blocks. We clamp
//    nothing else, so scale_inv = amax/448 exactly as the schema says.
//  - vLLM/DeepGEMM's per_block_cast_to_fp8 computes x * (448 / amax) rather
//    than x / (amax / 448); the two can differ by one code at rounding
//    boundaries. Both dequantize with the same scale_inv multiply.
//  - A NaN or infinite input is an error (InvalidArgument naming the element)
//    rather than a NaN block in the engine: a trainer that produced one has
//    diverged, and the inference side must not serve it.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace wsync {

inline constexpr int64_t kFp8BlockSize = 128;
inline constexpr float kE4M3Max = 448.0f;
inline constexpr uint8_t kE4M3MaxCode = 0x7E;  // +448
inline constexpr uint8_t kE4M3NaNCode = 0x7F;  // +NaN

// Bit-exact scalar conversions (see the conventions above).
float Bf16ToFp32(uint16_t bits);
uint16_t Fp32ToBf16(float value);
uint8_t Fp32ToE4M3(float value);
float E4M3ToFp32(uint8_t code);

// A read-only view of a row-major 2-D bf16 tensor; row_stride (in elements)
// may exceed cols, e.g. for a column slice of a wider tensor.
struct Bf16MatrixView {
  const uint16_t* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;
};

// A half-open sub-box [row_begin, row_end) x [col_begin, col_end) of a tensor.
struct MatrixBox {
  int64_t row_begin = 0;
  int64_t row_end = 0;
  int64_t col_begin = 0;
  int64_t col_end = 0;
};

// Number of 128-blocks covering n elements.
constexpr int64_t Fp8BlockCount(int64_t n) { return (n + kFp8BlockSize - 1) / kFp8BlockSize; }

// A block-quantized tensor: q is [rows, cols] fp8 bytes (row-major, dense),
// scale_inv is [Fp8BlockCount(rows), Fp8BlockCount(cols)] fp32 (row-major).
struct Fp8BlockTensor {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<uint8_t> q;
  std::vector<float> scale_inv;
};

// Quantizes the whole tensor.
StatusOr<Fp8BlockTensor> QuantizeFp8Blocks(const Bf16MatrixView& src);

// Quantizes only `box` of `src`, giving exactly the bytes and scales that
// QuantizeFp8Blocks(src) has there; the pipeline quantizes only what it sends.
// The box must start on block boundaries and end on one or at the tensor's
// edge (a block cut in two would need the other half for its amax).
// q_out receives [box rows, box cols] with row stride q_row_stride (bytes);
// scale_out receives the box's block grid [Fp8BlockCount(box rows),
// Fp8BlockCount(box cols)] with row stride scale_row_stride (elements).
// On error nothing is written.
Status QuantizeFp8BlocksInBox(const Bf16MatrixView& src, const MatrixBox& box,
                              uint8_t* q_out, int64_t q_row_stride,
                              float* scale_out, int64_t scale_row_stride);

// e4m3_to_fp32(q) * scale_inv for every element, as the engine computes it.
std::vector<float> DequantizeFp8Blocks(const Fp8BlockTensor& t);

}  // namespace wsync
