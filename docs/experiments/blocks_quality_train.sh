#!/usr/bin/env bash
# Issue 21's quality comparison, training stage: biglm / biglm-no-attn / biglm-blocks, two seeds each, equal tokens,
# on the synthetic grammar and on TinyStories (data prepared as in docs/LOG.md 2026-11-25). Run from the repository
# root with the prepared data under $D; all twelve runs side by side (tiny models: one GPU, or many CPU cores).
#   D=.exp21 OUT_DIR=runs/blocks bash docs/experiments/blocks_quality_train.sh
set -uo pipefail
D=${D:-.exp21}; R=${OUT_DIR:-runs/blocks}; STEPS_G=${STEPS_G:-800}; STEPS_T=${STEPS_T:-600}
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
mkdir -p "$R"
for seed in 0 1; do
  for v in biglm biglm-no-attn biglm-blocks; do
    python -m biglm pretrain --data $D/data --tokenizer $D/tok --out_dir $R/grammar-$v-s$seed --objective $v \
      --seed $seed --steps $STEPS_G --global_batch 64 --micro_batch 64 --seq_len 128 --warmup_steps 40 \
      --eval_every 200 --save_every 400 --compile no > $R/grammar-$v-s$seed.log 2>&1 &
    python -m biglm pretrain --data $D/ts_data --tokenizer $D/ts_tok --out_dir $R/ts-$v-s$seed --objective $v \
      --seed $seed --steps $STEPS_T --global_batch 64 --micro_batch 64 --seq_len 256 --warmup_steps 40 \
      --eval_every 200 --save_every 300 --compile no > $R/ts-$v-s$seed.log 2>&1 &
  done
done
wait
for run in $R/*-s[01]; do python -m biglm export $run $R/hf/$(basename $run) > /dev/null 2>&1 || echo "export failed: $run"; \
  cp $run/metrics.jsonl $R/hf/$(basename $run)/; done
tail -n 2 $R/*.log
