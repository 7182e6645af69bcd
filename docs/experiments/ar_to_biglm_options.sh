#!/usr/bin/env bash
# Issue 23's open measurement: the two options the literature uses when it adapts an autoregressive model to a
# masked one, as a 2 x 2 at equal steps, data, seed and lr:
#   {own position, shift (predict position i from i-1: `biglm convert --shift`)} x
#   {switch to BiGLM attention at once, anneal from causal over the first third (`--attention_anneal_steps`)}.
# One small AR Llama (ar_judge.py, transformers) is trained once and converted twice; each arm adapts it with the
# paper objective; blocks_quality_eval.py scores the four exports on the same held-out windows, masks and documents.
# CPU, one thread per process, two arms at a time. Data as in blocks_quality_train.sh (D=.exp21: ts_data, ts_tok).
#   D=.exp21 bash docs/experiments/ar_to_biglm_options.sh
set -euo pipefail
D=${D:-.exp21}; R=${OUT_DIR:-runs/ar2biglm-opts}
AR=${AR_STEPS:-400}; AD=${ADAPT_STEPS:-150}; ANNEAL=${ANNEAL_STEPS:-$((AD / 3))}
B=${BATCH:-32}; L=${SEQ_LEN:-128}; SEED=${SEED:-0}  # SEED: the adaptation's (masks, data order); the AR model is one
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
mkdir -p $R
if [ ! -f $R/ar/config.json ]; then
  python docs/experiments/ar_judge.py --data $D/ts_data --tokenizer $D/ts_tok --steps $AR --batch $B --seq-len $L \
    --save $R/ar > $R/ar.log 2>&1
fi
[ -f $R/own/config.json ] || python -m biglm convert $R/ar $R/own --shift false > $R/convert-own.log 2>&1
[ -f $R/shift/config.json ] || python -m biglm convert $R/ar $R/shift --shift true > $R/convert-shift.log 2>&1
arm() {  # arm NAME CONVERTED ANNEAL_STEPS
  local run=$1-s$SEED
  python -m biglm pretrain --init_from $R/$2 --out_dir $R/$run --data $D/ts_data --steps $AD --global_batch $B \
    --micro_batch $B --seq_len $L --warmup_steps 20 --lr 3e-4 --min_lr 3e-5 --eval_every $AD --save_every $AD \
    --eval_windows 64 --compile no --seed $SEED --attention_anneal_steps $3 > $R/$run.log 2>&1
  python -m biglm export $R/$run $R/hf/ts-$run > /dev/null
}
# NAME:CONVERTED:ANNEAL_STEPS, two at a time (ARMS="shift-switch:shift:0 shift-anneal:shift:150" runs a pair)
ARMS=${ARMS:-"own-switch:own:0 shift-switch:shift:0 own-anneal:own:$ANNEAL shift-anneal:shift:$ANNEAL"}
set -- $ARMS
while [ $# -gt 0 ]; do
  IFS=: read -r n c a <<< "$1"; arm $n $c $a &
  if [ $# -gt 1 ]; then IFS=: read -r n c a <<< "$2"; arm $n $c $a & shift; fi
  shift; wait
done
python docs/experiments/blocks_quality_eval.py --models $R/hf --data $D --out $R/eval.json > $R/eval.log 2>&1
python docs/experiments/ar_options_summary.py $R
