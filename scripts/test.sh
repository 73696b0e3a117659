#!/usr/bin/env bash
# The test command named in README.md: installs deps, builds, runs every ctest suite,
# the torch tests, a short chaos run, a short fuzz of every parser, then the
# ctest suites under ASan+UBSan and TSan.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
BUILD_DIR=${BUILD_DIR:-build}
# libfabric's shm provider leaves /dev/shm/<pid>:<domain>:<ep> behind when a
# process is killed; drop those of processes that are gone so a test run
# never starts on a full tmpfs.
# Our engines name their endpoints wsync-<pid>-<random>-...; same rule.
for f in /dev/shm/[0-9]*:* /dev/shm/wsync-[0-9]*-*; do
  [ -e "$f" ] || continue
  name=${f##*/}; name=${name#wsync-}; pid=${name%%[:-]*}
  kill -0 "$pid" 2>/dev/null || rm -f "$f"
done
echo "test: C++ suites (ctest)"
(cd "$BUILD_DIR" && ctest --output-on-failure -j "${JOBS:-2}" --timeout 600 "$@")
# The Python side: real torch FSDP2 trainers and transformers models through
# the wsync package (python/tests), in the venv scripts/python_env.sh keeps.
echo "test: Python side (torch venv, wsync package, pytest)"
VENV=$(bash scripts/python_env.sh)
"$VENV/bin/python" -m pytest -q -p no:cacheprovider python/tests
# A short chaos run (issue 10): agents and the controller SIGKILLed at random
# moments during updates, every complete version verified bit for bit. It
# fails on a silently wrong or hung version; an update that did not complete
# after a fault is reported, not fatal here (scripts/chaos.sh for the long
# run and docs/CONTROL_PLANE.md for the figures).
echo "test: short chaos run (10 faults, about a minute; scripts/chaos.sh runs 200)"
"$BUILD_DIR/cli/wsync" chaos --faults 10 --seed 3 --max-seconds 300 --allow-unrecovered
# The controller under attack during a running version (issue 29): 1,000
# idle connections, 80 slowloris clients and a flood of unsigned 16 MiB
# bodies; the version must complete, signed requests be answered within 1 s
# at p99, and the controller's RSS stay under 256 MB. Its last line is the
# figures as JSON.
echo "test: controller load test (scripts/load_test.py, 20 s of attack)"
python3 scripts/load_test.py --wsync "$BUILD_DIR/cli/wsync" --seconds 20
# Every parser of external input under libFuzzer + ASan/UBSan for a few
# seconds each (a clang build of its own in build-fuzz; docs/FUZZING.md).
echo "test: fuzz targets (scripts/fuzz.sh, ${FUZZ_SECONDS:-10} s each)"
bash scripts/fuzz.sh "${FUZZ_SECONDS:-10}"
# The C++ suites again, built with ASan+UBSan and with TSan in build-asan/
# and build-tsan/ (scripts/sanitize.sh says what each runs and leaves out).
# WSYNC_SANITIZE=asan|tsan runs one; WSYNC_SANITIZE=none skips them locally.
if [ "${WSYNC_SANITIZE:-all}" != none ]; then
  echo "test: C++ suites under sanitizers (${WSYNC_SANITIZE:-all})"
  bash scripts/sanitize.sh "${WSYNC_SANITIZE:-all}"
fi
