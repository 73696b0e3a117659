#!/usr/bin/env bash
# Installs every system package wsync needs to build and test, idempotently.
# Safe to run on a fresh Debian 12 machine and again on one that has them.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev
  libfabric-dev libfabric-bin libhwloc-dev libibverbs-dev rdma-core
  libgloo-dev libcpp-httplib-dev libssl-dev
  iproute2 procps
  # scripts/fuzz.sh: clang, and libFuzzer's runtime for it (on Debian 12
  # -fsanitize=fuzzer links libclang_rt.fuzzer from libclang-rt-14-dev)
  clang libclang-rt-14-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "install_deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
