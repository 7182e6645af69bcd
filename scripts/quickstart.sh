#!/usr/bin/env bash
# One command from a fresh clone: make a virtual environment (.venv, or $BIGLM_VENV), install PyTorch
# (the CUDA build only when an NVIDIA GPU is present, else the CPU build) and biglm with every extra,
# then run
#   scripts/quickstart.sh demo [ARGS]   `biglm pretrain` on its built-in default (the main job)
#   scripts/quickstart.sh test [ARGS]   the test suite (`python -m pytest -q`, as CI runs it)
#   scripts/quickstart.sh CMD [ARGS]    any command inside the environment, e.g. `biglm eval --help`
# Re-running reuses the environment; set BIGLM_TORCH_INDEX to force a PyTorch wheel index.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${BIGLM_VENV:-.venv}
TORCH_VERSION=2.13.0

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
. "$VENV/bin/activate"
python -m pip install -q --upgrade pip
if ! python -c "import torch" 2>/dev/null; then
  if [ -n "${BIGLM_TORCH_INDEX:-}" ]; then
    python -m pip install -q "torch==$TORCH_VERSION" --index-url "$BIGLM_TORCH_INDEX"
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    python -m pip install -q "torch==$TORCH_VERSION"          # PyPI's Linux wheel is the CUDA build
  elif [ "$(uname -s)" = Linux ] && curl -fsS --max-time 5 -o /dev/null https://download.pytorch.org/whl/cpu/torch/ 2>/dev/null; then
    python -m pip install -q "torch==$TORCH_VERSION" --index-url https://download.pytorch.org/whl/cpu
  else
    python -m pip install -q "torch==$TORCH_VERSION"          # macOS/Windows wheels and local mirrors: CPU
  fi
fi
python -m pip install -q -e ".[all]"

what=${1:-demo}
[ $# -gt 0 ] && shift
case "$what" in
  demo) exec biglm pretrain "$@" ;;
  test) exec python -m pytest -q "$@" ;;
  *) exec "$what" "$@" ;;
esac
