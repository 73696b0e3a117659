#!/usr/bin/env bash
# The test command named in README.md: installs deps, builds, runs every ctest suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
BUILD_DIR=${BUILD_DIR:-build}
cd "$BUILD_DIR"
ctest --output-on-failure -j "${JOBS:-2}" --timeout 600 "$@"
