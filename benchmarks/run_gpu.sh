#!/usr/bin/env bash
# Every GPU-only check in one place, for a session that has a GPU (the `device` tool runs it in the repository
# root; results land in benchmarks/results/*-gpu.* and are copied to $OUT if set). Sections, so each fits one
# 10-minute device call; no argument runs them all (~20 minutes on one H100):
#   bash benchmarks/run_gpu.sh tests attention      # then: pretrain, then: generation, then: speculative
# (speculative-carried is not in the default list: it benchmarks exports carried to the device, see docs/LOG.md)
#   bash benchmarks/run_gpu.sh decode     # issue 38 item 7 (benchmarks/gpu_decode.sh, 461 s on one H100): the default
#                                         # decoding against a compiled AR (carry runs/gpu-carry/a first, then b and .whl)
#   bash benchmarks/run_gpu.sh all        # issue 40's one command (<= 8 min): MFU new/previous path at 136M and 360M,
#                                         # SmolLM2 converted, adapted and evaluated there (benchmarks/gpu_all.sh)
#   bash benchmarks/run_gpu.sh --dry-run  # gpu_all.sh end to end on a CPU at tiny sizes (CI: tests/test_gpu_dry_run.py)
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--dry-run" ]; then exec bash benchmarks/gpu_all.sh --dry-run; fi
# the device machine has no network: use its own CUDA torch, import biglm from the tree; packages it lacks
# travel as wheels (see the device tool's README)
export PYTHONPATH="$PWD/src:$PWD/benchmarks:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
python -c "import transformers, tokenizers, safetensors, yaml" || { echo "missing packages: carry wheels"; exit 3; }
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
spec_bench() {  # MODEL N PROMPTS OUT [OPTION...]: bench_speculative.py on 24-token grammar prompts (issue 21)
  local m=$1 n=$2 p=$3 out=$4; shift 4
  python benchmarks/bench_speculative.py --checkpoint "$m" --prompt-len 24 --new-tokens "$n" --prompts "$p" --grammar \
    --device "${SPEC_DEVICE:-cuda}" --out "$out" "$@"
}
sections=("$@"); [ ${#sections[@]} -eq 0 ] && sections=(tests attention pretrain generation speculative)
rc=0
for s in "${sections[@]}"; do
  echo "=== $s"
  case "$s" in
    all) bash benchmarks/gpu_all.sh ;;                                   # issue 40: MFU >= 50% @360M, >= 45% @136M
    decode) bash benchmarks/gpu_decode.sh ;;                             # issue 38 item 7: vs a compiled AR
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
    speculative-carried)  # issue 21 on models trained elsewhere (carried exports, 640-token windows): SPEC_MODELS="DIR..."
                 for m in ${SPEC_MODELS:?name the carried exports: SPEC_MODELS=\"DIR ...\"}; do   # and SPEC_VAL=a val shard
                   for n in 128 512; do p=$([ $n = 128 ] && echo 16 || echo 5)
                     spec_bench $m $n $p speculative-grammar-$(basename $m)-n$n-p$p-gpu \
                       --val-shard ${SPEC_VAL:?SPEC_VAL=val shard} --repeats 2 --draft-lengths 3 --dtype float32 || break 2
                   done; done ;;
    speculative) G=${SPEC_DIR:-runs/speculative-gpu}; STEPS=${SPEC_STEPS:-800}  # issue 21 at batch 1: needs trained weights
                 python benchmarks/synthetic_grammar.py $G/src/grammar.txt --docs 20000 &&
                 python -m biglm tokenizer train --input $G/src/grammar.txt --out $G/tok --vocab_size 512 &&
                 python -m biglm data prepare $G/src --tokenizer $G/tok --out $G/data --val_docs 400 --workers 1 &&
                 python -m biglm pretrain --data $G/data --tokenizer $G/tok --out_dir $G/run --objective biglm-blocks \
                   --steps $STEPS --global_batch 64 --micro_batch 64 --seq_len 128 --warmup_steps 40 \
                   --eval_every $STEPS --save_every $STEPS &&     # the grammar model of docs/LOG.md, ~2 min
                 spec_bench $G/run 128 16 ${SPEC_OUT:-speculative-grammar-gpu} --val-shard $G/data/val-00000.bin \
                   --dtype ${SPEC_DTYPE:-bfloat16} &&
                 python -m biglm pretrain blocks-adapt --init_from $G/run --data $G/data --out_dir $G/w640 \
                   --steps $((STEPS * 3 / 8)) --seq_len 640 --global_batch 16 --micro_batch 16 \
                   --model.max_position_embeddings 640 --save_every $STEPS &&    # 640-token windows, for N = 512
                 spec_bench $G/w640 512 8 ${SPEC_OUT:-speculative-grammar-gpu}-n512 --val-shard $G/data/val-00000.bin \
                   --draft-lengths 3 --dtype ${SPEC_DTYPE:-bfloat16} ;;
    *) echo "unknown section $s (all, decode, tests, attention, pretrain, generation, speculative, speculative-carried)"; exit 2 ;;
  esac
  r=$?; [ $r -ne 0 ] && { echo "=== $s failed: rc $r"; rc=$r; }
  if [ -n "${OUT:-}" ]; then cp benchmarks/results/*-gpu.* "$OUT"/ 2>/dev/null; fi
done
exit $rc
