#!/usr/bin/env bash
# Builds and runs the GPU conformance checks of the fp8 reference kernels.
# Needs nvcc (sm_90 by default: ARCH=sm_100 etc. to change) and, for the
# informational comparison, python3 with torch and triton. Run from anywhere.
set -euo pipefail
cd "$(dirname "$0")/../../.."
BUILD=${BUILD:-/tmp/wsync-fp8-conformance}
mkdir -p "$BUILD"
g++ -O2 -std=c++20 -I. -c pipeline/fp8.cc -o "$BUILD/fp8.o"
g++ -O2 -std=c++20 -I. -c common/status.cc -o "$BUILD/status.o"
# No --use_fast_math: the kernel must divide with IEEE rounding and keep subnormals.
nvcc -O2 -std=c++20 -arch="${ARCH:-sm_90}" -I. tests/pipeline/gpu/fp8_conformance.cu \
  "$BUILD/fp8.o" "$BUILD/status.o" -o "$BUILD/fp8_conformance"
"$BUILD/fp8_conformance"
if [[ "${SKIP_TORCH:-0}" != 1 ]] && python3 -c 'import torch, triton' 2>/dev/null; then
  python3 tests/pipeline/gpu/fp8_torch_compare.py
fi
