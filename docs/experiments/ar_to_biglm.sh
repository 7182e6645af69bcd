#!/usr/bin/env bash
# Issue 23's experiment: a small AR Llama trained on TinyStories (transformers), converted (`biglm convert`) and
# adapted to a BiGLM (`--init_from`), against a BiGLM trained from scratch on the same total steps. Data as in
# blocks_quality_train.sh (D=.exp21: ts_data, ts_tok). Run from the repository root (one GPU: ~2 min).
set -euo pipefail
D=${D:-.exp21}; R=${OUT_DIR:-runs/ar2biglm}; AR=${AR_STEPS:-600}; AD=${ADAPT_STEPS:-300}
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
mkdir -p $R
python docs/experiments/ar_judge.py --data $D/ts_data --tokenizer $D/ts_tok --steps $AR --save $R/ar > $R/ar.log 2>&1
python -m biglm convert $R/ar $R/converted > $R/convert.log 2>&1
common="--data $D/ts_data --steps STEPS --global_batch 64 --micro_batch 64 --seq_len 256 --eval_every 300 --save_every 300 --compile no"
python -m biglm pretrain --init_from $R/converted --out_dir $R/adapted ${common/STEPS/$AD} --warmup_steps 20 --lr 3e-4 \
  --min_lr 3e-5 > $R/adapted.log 2>&1 &
python -m biglm pretrain --tokenizer $D/ts_tok --out_dir $R/scratch ${common/STEPS/$((AR + AD))} --warmup_steps 40 \
  > $R/scratch.log 2>&1 &
wait
for m in adapted scratch; do python -m biglm export $R/$m $R/hf/$m > /dev/null; done
tail -n 3 $R/*.log
