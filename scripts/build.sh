#!/usr/bin/env bash
# Configures and builds wsync into ${BUILD_DIR:-build} (Release, Ninja),
# saying what it is doing: a first build compiles ~100 files (minutes on a
# 2-core machine), a later one only what changed (seconds).
#   bash scripts/build.sh            # everything (tests too)
#   bash scripts/build.sh wsync      # only the named targets
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
start=$SECONDS
mkdir -p "$BUILD_DIR"
fresh=0
if [ -f "$BUILD_DIR/build.ninja" ]; then
  echo "build: checking the configuration of $BUILD_DIR (cmake)"
else
  fresh=1
  echo "build: configuring $BUILD_DIR (cmake, first time only: ~10-30 s)"
fi
if ! cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" >"$BUILD_DIR/configure.log" 2>&1; then
  tail -n 30 "$BUILD_DIR/configure.log" >&2
  echo "build: cmake failed; the whole log is $BUILD_DIR/configure.log" >&2
  exit 1
fi
[ "$fresh" = 1 ] && echo "build: configured in $((SECONDS - start)) s (log: $BUILD_DIR/configure.log)"
targets=("$@")
what=${targets[*]:-all targets}
# Steps left to run, from a dry run (it only compares timestamps).
steps=$(ninja -C "$BUILD_DIR" -n "${targets[@]}" | grep -c '^\[' || true)
if [ "$steps" -eq 0 ]; then
  echo "build: $what up to date ($((SECONDS - start)) s)"
  exit 0
fi
# ~6 s of one core per step (heavy C++: gloo, httplib, nlohmann) when the
# machine is otherwise idle.
echo "build: compiling $what: $steps steps with $JOBS jobs, roughly $(( (steps * 6 / JOBS + 59) / 60 )) min on an idle machine"
# Ninja's status line: steps done / total, percent, seconds so far (one
# line rewritten in place on a terminal, a line per step in a log).
NINJA_STATUS="build: [%f/%t %p %e s] " cmake --build "$BUILD_DIR" -j "$JOBS" ${targets[@]:+--target "${targets[@]}"}
echo "build: done in $((SECONDS - start)) s"
