#!/usr/bin/env bash
# Table 1 at micro scale on a CPU (issue 10, docs/LOG.md): the three variants x two seeds, then their
# evaluation and `biglm report`. Run from a working directory that holds (or will hold) data/ and runs.
#   SHARED=../shared/data bash scripts/table1_micro.sh [train|eval|report|all]
set -euo pipefail
SHARED=${SHARED:-../shared/data}
S=$SHARED/pretrain
STAGE=${1:-all}
SEEDS=${SEEDS:-"0 1"}
VARIANTS=${VARIANTS:-"biglm no-attn mlm"}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

if [[ $STAGE == all || $STAGE == train ]]; then
  # one tokenizer and one set of shards for every run; 200 documents per source held out
  [[ -f data/table1-micro-tok/tokenizer.json ]] || biglm tokenizer train \
      --input $S/tinystories/TinyStories-train.head.txt,$S/gutenberg,$S/brown --vocab_size 8192 \
      --limit_bytes 12000000 --out data/table1-micro-tok
  [[ -f data/table1-micro/manifest.json ]] || biglm data prepare $S/tinystories/TinyStories-train.head.txt \
      $S/gutenberg $S/brown $S/inaugural $S/state_union --tokenizer data/table1-micro-tok --out data/table1-micro \
      --val_docs 200 --workers 1 --progress false
  for seed in $SEEDS; do
    for v in $VARIANTS; do
      biglm pretrain table1-micro-$v --seed $seed --out_dir runs/table1-micro-$v-s$seed
    done
  done
fi

if [[ $STAGE == all || $STAGE == eval ]]; then
  for seed in $SEEDS; do
    for v in $VARIANTS; do
      run=runs/table1-micro-$v-s$seed
      # held-out masked loss / fill-in accuracy (BiGLM setting, same masks for all) and continuation perplexity
      biglm eval --suite heldout --heldout_data data/table1-micro --heldout_seq_len 128 \
          --model_args pretrained=$run --output_path $run/eval
      # the zero-shot suite on a fixed subset (near chance at this size; reported anyway)
      biglm eval --suite paper --data_dir $SHARED/eval --model_args pretrained=$run --limit ${LIMIT:-200} \
          --output_path $run/eval/paper
    done
  done
fi

if [[ $STAGE == all || $STAGE == report ]]; then
  biglm report runs/table1-micro-*-s* --baseline table1-micro-biglm --out runs/table1-micro-report
fi
