#!/usr/bin/env bash
# Configures and builds wsync into ${BUILD_DIR:-build} (Release, Ninja).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} >/dev/null
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}"
