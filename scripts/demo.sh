#!/usr/bin/env bash
# README command one: the local weight-sync demo. Builds wsync, then starts a
# controller, 4 trainer agents and 2 inference agents as real processes,
# moves a ~1 GB Qwen3-MoE-shaped model over libfabric (shm) on this machine
# for several updates, and checks every inference byte after each one.
# Extra arguments go to `wsync demo` (see `build/cli/wsync demo --help`).
# Every phase says what it does and how long it took: packages (first run
# only), the build (a first build takes minutes), then the demo itself.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
echo "demo: step 1 of 2: system packages and the wsync binary (scripts/build.sh; nothing to do after the first run)"
bash scripts/build.sh wsync
echo "demo: step 2 of 2: running $BUILD_DIR/cli/wsync demo${*:+ $*}"
exec "$BUILD_DIR/cli/wsync" demo "$@"
