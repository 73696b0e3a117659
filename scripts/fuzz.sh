#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang (ASan + UBSan) into
# ${FUZZ_BUILD_DIR:-build-fuzz} and runs each for SECONDS_PER_TARGET seconds
# (default 15) on its corpus. Prints executions and crashes per target; on a
# crash, the crashing input's path and its stack, and exits non-zero.
# docs/FUZZING.md says how to run one target for hours.
#   bash scripts/fuzz.sh [SECONDS_PER_TARGET]
#   FUZZ_TARGETS="trainer_spec descriptor" bash scripts/fuzz.sh 60
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${1:-15}
BUILD=${FUZZ_BUILD_DIR:-build-fuzz}
JOBS=${JOBS:-$(nproc)}
t0=$(date +%s)

echo "fuzz: checking system packages (clang, libFuzzer runtime, build deps)"
bash scripts/install_deps.sh

echo "fuzz: configuring $BUILD (clang, -fsanitize=fuzzer,address,undefined, WSYNC_FUZZ=ON)"
CC=clang CXX=clang++ cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Fuzz \
  -DWSYNC_FUZZ=ON -DWSYNC_TESTS=OFF -DWSYNC_PYTHON=OFF >/dev/null
echo "fuzz: building the targets and their seed corpus (ninja, $JOBS jobs)"
cmake --build "$BUILD" --target wsync_fuzz -j "$JOBS"
t_built=$(date +%s)
echo "fuzz: build took $((t_built - t0)) s"

ALL=$(sed -n '/^set(WSYNC_FUZZ_TARGETS/,/^)/p' fuzz/CMakeLists.txt | sed -n 's/^  \([a-z_]*\).*/\1/p')
TARGETS=${FUZZ_TARGETS:-$ALL}
out="$BUILD/fuzz"
mkdir -p "$out/logs"
stamp="$out/logs/.run-start"
touch "$stamp"

# One target: its corpus folder gains what libFuzzer finds; crashes, leaks
# and timeouts land in crashes/<target>/ (kept across runs).
run_one() {
  local t=$1
  mkdir -p "$out/corpus/$t" "$out/crashes/$t"
  set +e
  "$out/fuzz_$t" "$out/corpus/$t" -max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$out/crashes/$t/" >"$out/logs/$t.log" 2>&1
  echo $? >"$out/logs/$t.rc"
  set -e
}

echo "fuzz: running $(echo $TARGETS | wc -w) targets for ${SECONDS_PER_TARGET} s each, $JOBS at a time" \
     "(logs in $out/logs/)"
running=0
for t in $TARGETS; do
  [ -x "$out/fuzz_$t" ] || { echo "fuzz: no binary $out/fuzz_$t (not in fuzz/CMakeLists.txt?)"; exit 2; }
  echo "fuzz:   start $t (corpus $out/corpus/$t: $(ls "$out/corpus/$t" 2>/dev/null | wc -l) inputs)"
  run_one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$JOBS" ]; then wait -n || true; running=$((running - 1)); fi
done
wait || true

failed=0
printf 'fuzz: %-20s %12s %8s %8s  %s\n' target executions exec/s crashes corpus
for t in $TARGETS; do
  log="$out/logs/$t.log"
  rc=$(cat "$out/logs/$t.rc" 2>/dev/null || echo 99)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  new=$(find "$out/crashes/$t" -type f -newer "$stamp" | sort)
  crashes=$(echo -n "$new" | grep -c . || true)
  [ "$rc" -ne 0 ] && [ "$crashes" -eq 0 ] && crashes=1  # died without leaving an input
  printf 'fuzz: %-20s %12s %8s %8s  %s inputs\n' "$t" "${execs:-?}" "${rate:-?}" "$crashes" \
    "$(ls "$out/corpus/$t" | wc -l)"
  if [ "$crashes" -ne 0 ]; then
    failed=1
    echo "fuzz: !! $t crashed (exit $rc); crashing input(s):"
    for f in $new; do echo "fuzz: !!   $f   (reproduce: $out/fuzz_$t $f)"; done
    echo "fuzz: !! what it printed (full log: $log):"
    # The sanitizer's or libFuzzer's report: from its first error line on.
    awk '/^==[0-9]+==|ERROR: libFuzzer|runtime error:|wsync fuzz:|terminate called/{p=1}
         /^Shadow bytes|^MS: |^artifact_prefix|^stat::|rudimentary signal|Combine libFuzzer/{next} p' "$log" |
      head -60 | sed 's/^/fuzz: !!   /'
  fi
done
t_end=$(date +%s)
echo "fuzz: runs took $((t_end - t_built)) s; total $((t_end - t0)) s"
if [ "$failed" -ne 0 ]; then
  echo "fuzz: FAILED: a parser crashed, leaked or hung on the inputs above (docs/FUZZING.md: fixing one)"
  exit 1
fi
echo "fuzz: OK: no crashes"
