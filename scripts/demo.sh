#!/usr/bin/env bash
# README command one: the local weight-sync demo. Builds wsync, then starts a
# controller, 4 trainer agents and 2 inference agents as real processes,
# moves a ~1 GB Qwen3-MoE-shaped model over libfabric (shm) on this machine
# for several updates, and checks every inference byte after each one.
# Extra arguments go to `wsync demo` (see `build/cli/wsync demo --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh >/dev/null
exec build/cli/wsync demo "$@"
