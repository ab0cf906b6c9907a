#!/usr/bin/env bash
# Fill .whl/ with the wheels `gpu_run.sh` installs on the device machine, whose image lacks them and has no
# package index (/work/.library/device/KINDS.md: its python3 is CPython 3.12 on x86-64 Linux, with torch,
# typer, rich, pyyaml, aiohttp, safetensors and tokenizers already there). Run it here, then hand the folder
# over with the run, e.g. run(command="bash benchmarks/gpu_run.sh", carry=[".whl"], timeout_s=480).
# .whl/ is git-ignored: the wheels travel with the run, never with the repository.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
rm -rf .whl
"$PY" -m pip download -q --only-binary=:all: --python-version "${DEVICE_PYTHON:-3.12}" \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl msgspec pyzmq jsonschema
ls .whl
