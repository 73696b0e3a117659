#!/usr/bin/env bash
# README command one: runs wsync's main job on a built-in default.
# Until the loopback sync demo lands, that is a dry-run plan of the reference case.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh >/dev/null
exec build/cli/wsync plan examples/kimi-k2-256x128 "$@"
