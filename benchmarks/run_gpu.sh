#!/usr/bin/env bash
# Every GPU-only check of issues 2-4 in one go, for a session that has a GPU (the `device` tool runs it
# in the repository root; results land in benchmarks/results/*-gpu.json and are copied to $OUT if set).
#   bash benchmarks/run_gpu.sh            # ~20 minutes on one H100
set -uo pipefail
cd "$(dirname "$0")/.."
# the device machine has no network: use its own CUDA torch, import biglm from the tree; packages it lacks
# (transformers, tokenizers, safetensors, datasets, pyyaml) travel as wheels (see the device tool's README)
export PYTHONPATH="$PWD/src:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
python -c "import transformers, tokenizers, safetensors, yaml" || { echo "missing packages: carry wheels"; exit 3; }
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
python -m pytest -q tests/test_gpu.py tests/test_model.py                              # flex bf16 fwd+bwd vs SDPA
python benchmarks/bench_attention.py --presets biglm-136m,biglm-360m --seq-len 2048 --batch 8   # target: masked <= 0.9x dense
python benchmarks/bench_pretrain.py --presets biglm-136m,biglm-360m --seq-len 2048 --batch 8 --compile  # MFU >= 45% @360M, >= 1.3x ModernBERT
python benchmarks/bench_generation.py --preset biglm-136m --device cuda --dtype bfloat16 --compile \
       --new-tokens 128 256 512 --batch 1 32 --steps 4 8 16 32 64 --out bench_generation_gpu  # target: batch-1 <= 1/3 AR at 256
if [ -n "${OUT:-}" ]; then cp benchmarks/results/*gpu* "$OUT"/ 2>/dev/null; fi
