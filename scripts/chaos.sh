#!/usr/bin/env bash
# The chaos run (issue 10): on the local deployment (controller, 4 trainer
# agents, 2 inference agents, real processes over libfabric shm), one update
# per fault, each killing a random trainer agent, inference agent or the
# controller with SIGKILL at a random moment and restarting it; then an
# update that must complete. Every complete version is checked bit for bit.
# The last line is a JSON object: attempted, completed, failed_reported,
# silently_wrong, hangs (plus faults, not_recovered, by_kind, seconds).
# Exit status 0 only if silently_wrong, hangs and not_recovered are 0.
#
#   bash scripts/chaos.sh [--faults 200] [--seed N] [--provider "tcp;ofi_rxm"]
set -euo pipefail
cd "$(dirname "$0")/.."
echo "chaos: building wsync (scripts/build.sh)"
bash scripts/build.sh wsync
exec build/cli/wsync chaos "$@"
