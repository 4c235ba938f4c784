#!/usr/bin/env bash
# Exercise the real pynvml backend on a machine with an NVIDIA GPU and driver.
# Needs the project's virtual environment (.venv, with nvidia-ml-py installed) carried
# along: there is no network on the GPU machine, so nothing is installed here.
# Usage (repository root): tests/gpu/run.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
if [ ! -x "$PY" ]; then PY=python3; fi
nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id --format=csv || true
"$PY" -m pytest -q -s -p no:cacheprovider tests/gpu "$@"
