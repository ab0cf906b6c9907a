#!/usr/bin/env bash
# Create .venv (if absent) and install specctl with its test extras into it.
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
"$VPY" -m pip install --quiet -e ".[test]"
