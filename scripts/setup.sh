#!/usr/bin/env bash
# Create .venv (if absent) and install both specctl installs into it: the tool (`pip install specctl`: no
# torch) and the builtin engine (`specctl[engine]`), with the test extras.
# torch: a torch the environment already has is kept (GPU users bring their own); otherwise the
# pinned CPU release is installed first, so pip never resolves an unpinned multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
if ! "$VPY" -c "import torch" >/dev/null 2>&1; then
  "$VPY" -m pip install --quiet "torch==${SPECCTL_TORCH_VERSION:-2.13.0}"
fi
"$VPY" -m pip install --quiet -e ".[engine,test]"
# smg (the default router) and sglang-router (the test extra keeps it selectable) both install a `smg`
# script; the one on PATH must be smg's, which exported router.sh files run as `smg launch`.
if ! grep -q "from smg.cli import" .venv/bin/smg 2>/dev/null; then
  "$VPY" -m pip install --quiet --no-deps --force-reinstall "smg==1.13.0"
fi
# --- BEGIN sglang-parser test extra (issue 9) -------------------------------------------------------
# tests/test_sglang_parser.py checks specctl's SGLang flag table and every exported command with
# SGLang's own parser (ServerArgs.add_cli_args + from_cli_args). SGLang is installed WITHOUT its
# dependencies (its full stack needs CUDA); the parser needs only these light packages, and `triton`
# is a stub module inside the test helper. `specctl validate` itself never imports sglang.
# SPECCTL_SKIP_SGLANG=1 skips this block (the SGLang-parser tests then skip themselves).
if [ "${SPECCTL_SKIP_SGLANG:-0}" != "1" ]; then
  "$VPY" -m pip install --quiet --no-deps "sglang==0.5.23"
  "$VPY" -m pip install --quiet numpy msgspec orjson psutil pybase64 requests packaging pillow starlette \
    pydantic pyzmq tqdm IPython aiohttp
fi
# --- END sglang-parser test extra ---------------------------------------------------------------------
