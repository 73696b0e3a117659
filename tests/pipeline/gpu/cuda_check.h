// CUDA_OK(call): the GPU programs' one check of a CUDA runtime call: on
// failure it names the call and CUDA's message and exits with status 2.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CUDA_OK(call)                                                          \
  do {                                                                         \
    cudaError_t e_ = (call);                                                   \
    if (e_ != cudaSuccess) {                                                   \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_));  \
      std::exit(2);                                                            \
    }                                                                          \
  } while (0)
