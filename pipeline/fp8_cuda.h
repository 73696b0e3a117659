// The fp8 e4m3 128x128 block quantize of pipeline/fp8.h as a CUDA kernel,
// for the GPU pipeline: bit-identical to the CPU reference (IEEE division,
// saturating e4m3 conversion, no subnormal flush; an all-zero block gets
// scale_inv 1.0), checked on an H200 by tests/pipeline/gpu/fp8_bench.cu.
//
// Built into wsync_pipeline_cuda where the CUDA toolkit is found; nothing
// else in the pipeline needs CUDA to build. Callers: the torch extension's
// CUDA device (python/src/torch_device.cc) and the GPU bench.
#pragma once

#include <cstdint>
#include <string>

#include <cuda_runtime.h>

namespace wsync {

// x: `batch` row-major bf16 matrices [rows, cols] back to back (experts);
// q: the same shape in e4m3 codes; scale_inv: per matrix
// [ceil(rows/128), ceil(cols/128)] fp32. Device pointers; runs on `stream`.
// `nonfinite` (device memory, may be null) gets 1 or'ed in where a block
// holds a NaN or an infinity: its codes are meaningless and must not be sent.
// `launch`: kOverlapped (kAuto), a programmatic dependent launch: the CTAs
// start while the stream's previous kernel drains and wait for its end
// before their first load, so back-to-back calls lose no launch gap and
// ramp-up; kPlain, an ordinary launch, for comparison. What moved the
// figure against a device-to-device copy (H100, fp8_bench, 2026-12-07) was
// that fixed cost per call, which weighs most on short calls (kPlain: 0.966
// at 256 MiB, 0.949 at 112 MiB; kOverlapped: 0.975, 0.967), not the work
// run before it nor the clocks, nor registers (4 CTAs an SM instead of 3)
// or a persistent grid (slower).
enum class Fp8Launch { kAuto, kPlain, kOverlapped };
cudaError_t QuantizeFp8BlocksCuda(const uint16_t* x, int64_t batch, int64_t rows, int64_t cols, uint8_t* q,
                                  float* scale_inv, cudaStream_t stream, int* nonfinite = nullptr,
                                  Fp8Launch launch = Fp8Launch::kAuto);

// Runs the kernel on the current device (on `stream`) over two stacked
// [200, 264] matrices (partial blocks) of values that test the rounding
// (signed zeros, a block of tiny values, huge ones, subnormals) and compares
// it byte for byte with pipeline/fp8.h's CPU reference: "" when they agree,
// else why not (a GPU or toolkit the kernel was never checked on). Callers
// check once per device before the kernel quantizes any weight.
std::string Fp8KernelDisagreement(cudaStream_t stream);

}  // namespace wsync
