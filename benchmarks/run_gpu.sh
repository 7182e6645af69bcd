#!/usr/bin/env bash
# Every GPU-only check in one place, for a session that has a GPU (the `device` tool runs it in the repository
# root; results land in benchmarks/results/*-gpu.* and are copied to $OUT if set). Sections, so each fits one
# 10-minute device call; no argument runs them all (~20 minutes on one H100):
#   bash benchmarks/run_gpu.sh tests attention      # then: pretrain, then: generation
set -uo pipefail
cd "$(dirname "$0")/.."
# the device machine has no network: use its own CUDA torch, import biglm from the tree; packages it lacks
# travel as wheels (see the device tool's README)
export PYTHONPATH="$PWD/src:$PWD/benchmarks:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
python -c "import transformers, tokenizers, safetensors, yaml" || { echo "missing packages: carry wheels"; exit 3; }
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
sections=("$@"); [ ${#sections[@]} -eq 0 ] && sections=(tests attention pretrain generation)
rc=0
for s in "${sections[@]}"; do
  echo "=== $s"
  case "$s" in
    tests) python -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_model.py ;;  # flex bf16 fwd+bwd vs SDPA
    attention) python benchmarks/bench_attention.py --presets biglm-136m,biglm-360m --seq-len 2048 --batch 8 \
                 --out attention-gpu ;;                                    # target: masked <= 0.9x dense
    pretrain) python benchmarks/bench_pretrain.py --presets biglm-136m,biglm-360m --seq-len 2048 --batch 8 --compile \
                --out pretrain-gpu ;;                                      # MFU >= 45% @360M, >= 1.3x ModernBERT
    generation) python benchmarks/bench_generation.py --preset biglm-136m --device cuda --dtype bfloat16 \
                  --new-tokens 128 512 --batch 1 32 --tokens-per-step 2 --block-length 8 32 --repeats 2 \
                  --out generation-gpu &&                                   # issue 21's protocol, eager (the AR peer's --compile path breaks on transformers 5.17 cudagraphs)
                python benchmarks/bench_generation.py --preset biglm-136m --device cuda --dtype bfloat16 \
                  --new-tokens 128 512 --batch 1 32 --tokens-per-step 1 2 --block-length 1 2 4 8 \
                  --variants ar block-append --repeats 3 --out generation-blocks-small-gpu ;;  # the CPU run's regimes
    *) echo "unknown section $s (tests, attention, pretrain, generation)"; exit 2 ;;
  esac
  r=$?; [ $r -ne 0 ] && { echo "=== $s failed: rc $r"; rc=$r; }
  if [ -n "${OUT:-}" ]; then cp benchmarks/results/*-gpu.* "$OUT"/ 2>/dev/null; fi
done
exit $rc
