#!/usr/bin/env bash
# Installs every system package wsync needs to build and test, idempotently.
# Safe to run on a fresh Debian 12 machine and again on one that has them.
# Says what it is doing: on a fresh machine apt downloads and unpacks a few
# hundred MB (a minute or a few); it prints progress every 25 packages.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev
  libfabric-dev libfabric-bin libhwloc-dev libibverbs-dev rdma-core
  libgloo-dev libcpp-httplib-dev libssl-dev
  iproute2 procps
  # scripts/load_test.py (standard library only), scripts/python_env.sh
  python3 python3-venv
  # scripts/fuzz.sh: clang, and libFuzzer's runtime for it (on Debian 12
  # -fsanitize=fuzzer links libclang_rt.fuzzer from libclang-rt-14-dev)
  clang libclang-rt-14-dev
  # compiler cache: the Python extension's build (build-python/) compiles
  # the same libraries as build/ with the same flags and reuses them
  ccache
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
start=$SECONDS
echo "install_deps: ${#missing[@]} of ${#PACKAGES[@]} Debian packages missing: ${missing[*]}"
echo "install_deps: apt-get update (package lists, ~10-30 s)"
$SUDO apt-get update -qq
echo "install_deps: apt-get install (they and their dependencies; on a fresh machine a few hundred MB, 1-5 min)"
# apt's own lines condensed: the totals, then a count every 25 packages
# downloaded and set up; errors and warnings as they come.
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q -o Dpkg::Use-Pty=0 --no-install-recommends "${missing[@]}" 2>&1 |
  awk -v every=25 '
    /newly installed/ { n = $3 + 0; print "install_deps: " $0; fflush(); next }
    /^Need to get/    { print "install_deps: " $0; fflush(); next }
    /^Get:/           { if (++got % every == 0) { printf "install_deps: downloaded %d of %d\n", got, n; fflush() } next }
    /^Setting up /    { if (++set % every == 0) { printf "install_deps: set up %d of %d\n", set, n; fflush() } next }
    /^(E|W|Err):/     { print; fflush(); next }
    END               { if (set) printf "install_deps: set up %d packages\n", set }'
echo "install_deps: done in $((SECONDS - start)) s"
