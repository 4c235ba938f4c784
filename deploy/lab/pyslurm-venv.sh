#!/usr/bin/env bash
# Makes a virtual environment with trainmedic (+ dev tools) and pyslurm built against the
# Slurm install under PREFIX (deploy/lab/build-slurm.sh), for SLURM_ACCESS=pyslurm and
# `make test-pyslurm`. The main .venv stays without pyslurm.
#
#   deploy/lab/pyslurm-venv.sh PREFIX [VENV] [PYSLURM_VERSION]
#
# Idempotent: VENV/.pyslurm-installed (written last) records the prefix and versions; a
# venv whose stamp matches is reused, pyproject.toml changes reinstall trainmedic only.
set -euo pipefail

prefix=${1:?usage: pyslurm-venv.sh PREFIX [VENV] [PYSLURM_VERSION]}
venv=${2:-.venv-pyslurm}
pyslurm_version=${3:-25.11.2}
python=${PYTHON:-python3}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
stamp=$venv/.pyslurm-installed
want="prefix=$prefix pyslurm=$pyslurm_version"
jobs=$(nproc 2>/dev/null || echo 2)

say() { printf 'pyslurm-venv: %s\n' "$*" >&2; }

if [ ! -f "$prefix/.trainmedic-build-complete" ]; then
  say "no finished Slurm build in $prefix (run deploy/lab/build-slurm.sh first)"
  exit 2
fi

if [ ! -x "$venv/bin/python" ]; then
  say "creating $venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
fi

# trainmedic itself (editable), again whenever pyproject.toml is newer than the venv's mark.
if [ ! -f "$venv/.trainmedic-installed" ] || [ "$repo/pyproject.toml" -nt "$venv/.trainmedic-installed" ]; then
  say "installing trainmedic[dev] into $venv"
  "$venv/bin/python" -m pip install -q -e "$repo[dev]"
  touch "$venv/.trainmedic-installed"
fi

if [ -f "$stamp" ] && grep -qxF "$want" "$stamp" &&
  "$venv/bin/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('pyslurm') is None)"; then
  say "pyslurm $pyslurm_version for $prefix already in $venv (reused)"
  exit 0
fi

# The wheel is kept beside the Slurm build it was compiled against (under the state
# directory), so a fresh clone's venv installs it in seconds instead of rebuilding it.
pyver=$("$venv/bin/python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
wheels="$prefix/wheels/pyslurm-$pyslurm_version-$pyver"
rm -f "$stamp"
if ! ls "$wheels"/pyslurm-*.whl >/dev/null 2>&1; then
  say "building pyslurm $pyslurm_version against $prefix (Cython + C, a few minutes)"
  start=$(date +%s)
  # setuptools reads build_ext's `parallel` from ~/.pydistutils.cfg: a private HOME gives
  # the C compilation all cores without touching the user's files.
  build_home=$(mktemp -d)
  trap 'rm -rf "$build_home" "$wheels.tmp"' EXIT
  printf '[build_ext]\nparallel = %s\n' "$jobs" >"$build_home/.pydistutils.cfg"
  rm -rf "$wheels.tmp"
  HOME=$build_home \
    SLURM_INCLUDE_DIR="$prefix/include" SLURM_LIB_DIR="$prefix/lib" PYSLURM_BUILD_JOBS="$jobs" \
    "$venv/bin/python" -m pip wheel -q --no-deps --no-binary pyslurm -w "$wheels.tmp" \
    "pyslurm==$pyslurm_version"
  mv "$wheels.tmp" "$wheels"
  say "pyslurm built in $(($(date +%s) - start))s (wheel kept in $wheels)"
else
  say "pyslurm $pyslurm_version wheel for $prefix reused from $wheels"
fi
"$venv/bin/python" -m pip install -q "$wheels"/pyslurm-*.whl
echo "$want" >"$stamp.tmp"
mv "$stamp.tmp" "$stamp"
