#!/usr/bin/env bash
# GPU figures on a CUDA machine (issue 8), each beside its limit measured in
# the same run:
#   1. the fp8 quantize kernel (pipeline/fp8_cuda.cu): bit-identical to the
#      CPU reference, and its GB/s against this GPU's device-to-device copy;
#   2. the engine's GPU-to-GPU write (tests/transport/gpu/gpu_write.cc,
#      two processes, shm with FI_HMEM cuda) against libfabric's own
#      fi_rma_bw -D cuda writedata over the same libfabric, per size.
# Needs nvcc, a libfabric built with CUDA (LIBFABRIC_DIR: lib/ with
# libfabric.so.1, bin/ with fi_rma_bw; not built by this project) and the
# transport_gpu_write binary (GPU_WRITE; built by the project's CMake).
set -uo pipefail
cd "$(dirname "$0")/.."
LIBFABRIC_DIR=${LIBFABRIC_DIR:?a libfabric built with CUDA: lib/ and bin/fi_rma_bw}
GPU_WRITE=${GPU_WRITE:-build/tests/transport/transport_gpu_write}
DST_GPU=${DST_GPU:-0}
SIZES=${SIZES:-"1048576 4194304 16777216 67108864 268435456"}
OUT=${OUT:-/tmp/wsync-gpu-bench}
WORK=${WORK:-/tmp/wsync-gpu-bench-work}   # build outputs and per-run logs
mkdir -p "$OUT" "$WORK"
export LD_LIBRARY_PATH="$LIBFABRIC_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export FI_HMEM_CUDA_ENABLE_XFER=${FI_HMEM_CUDA_ENABLE_XFER:-1}
say() { echo "gpu_bench: $*"; }

say "1. fp8 quantize kernel"
if [ "${SKIP_FP8:-0}" != 1 ]; then
  g++ -O2 -std=c++20 -I. -c pipeline/fp8.cc -o "$WORK/fp8.o" && g++ -O2 -std=c++20 -I. -c common/status.cc -o "$WORK/status.o" &&
  nvcc -O3 -std=c++17 -arch=sm_90 -diag-suppress 2810 -I. tests/pipeline/gpu/fp8_bench.cu pipeline/fp8_cuda.cu \
    "$WORK/fp8.o" "$WORK/status.o" -o "$WORK/fp8_bench" && "$WORK/fp8_bench" | tee "$OUT/fp8_bench.txt"
fi

say "2. GPU-to-GPU writes: libfabric's fi_rma_bw vs the engine (shm, FI_HMEM cuda, GPU 0 -> GPU $DST_GPU)"
"$LIBFABRIC_DIR/bin/fi_info" -p shm -c FI_HMEM 2>&1 | grep -m1 -E "provider|fi_getinfo" || true
# Both sides at the same depth (WINDOW writes in flight), best of ROUNDS runs
# each: short runs on a shared node are noisy, and the best is each one's limit.
WINDOW=${WINDOW:-16}
ROUNDS=${ROUNDS:-3}
printf "%10s %14s %14s %8s\n" bytes fi_rma_bw_GBps wsync_GBps ratio | tee "$OUT/writes.txt"
best() { tr ' ' '\n' | grep . | sort -g | tail -1; }  # the largest figure, or nothing
for size in $SIZES; do
  iters=${ITERS:-$(( size >= 67108864 ? 40 : 400 ))}
  refs="" ours_all=""
  for round in $(seq "$ROUNDS"); do
    timeout 60 "$LIBFABRIC_DIR/bin/fi_rma_bw" -p shm -E -o writedata -D cuda -i 0 -S "$size" -I "$iters" -W "$WINDOW" \
      > "$WORK/rma_server_${size}_$round.txt" 2>&1 &
    sleep 1
    timeout 60 "$LIBFABRIC_DIR/bin/fi_rma_bw" -p shm -E -o writedata -D cuda -i "$DST_GPU" -S "$size" -I "$iters" -W "$WINDOW" \
      127.0.0.1 > "$WORK/rma_client_${size}_$round.txt" 2>&1
    wait
    # bytes per usec/xfer of the result line (its columns can run together)
    refs="$refs $(awk -v s="$size" '$1 ~ /^[0-9]+[kmg]?$/ && NF >= 6 {u=$(NF-1)} END {if (u > 0) printf "%.2f", s / u / 1000}' \
      "$WORK/rma_client_${size}_$round.txt")"
    timeout ${WRITE_TIMEOUT:-60} "$GPU_WRITE" bytes="$size" iters="$iters" dst_gpu="$DST_GPU" window="$WINDOW" \
      > "$WORK/wsync_${size}_$round.txt" 2>&1
    one=$(sed -n 's/.*verified; \([0-9.]*\) GB\/s.*/\1/p' "$WORK/wsync_${size}_$round.txt")
    [ -n "$one" ] || tail -4 "$WORK/wsync_${size}_$round.txt"
    ours_all="$ours_all $one"
  done
  ref=$(echo "$refs" | best); ours=$(echo "$ours_all" | best)
  echo "  $size bytes, $ROUNDS rounds: fi_rma_bw$refs; wsync$ours_all" >> "$OUT/rounds.txt"
  ratio=$(awk -v a="${ours:-0}" -v b="${ref:-0}" 'BEGIN {if (b > 0) printf "%.3f", a / b; else print "n/a"}')
  printf "%10s %14s %14s %8s\n" "$size" "${ref:-fail}" "${ours:-fail}" "$ratio" | tee -a "$OUT/writes.txt"
done
say "figures in $OUT, logs in $WORK"
