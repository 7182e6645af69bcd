#!/usr/bin/env bash
# The issue-9 CPU demonstration (docs/LOG.md, 2026-11-25): pre-train a small BiGLM for about an hour on the shared
# pre-training text, then fine-tune it on XSum and SQuAD-QG (CMLM, Table 3) and on a FLAN-style mixture
# (Table 5), evaluate the FLAN model with `biglm eval --suite multitask`, and measure quality against T.
# Run from the repository root with ../shared beside it; everything goes to $W (default runs/demo9).
set -euxo pipefail
cd "$(dirname "$0")/../.."
S=../shared/data/pretrain
D=../shared/data/finetune
W=${W:-runs/demo9}
mkdir -p "$W"

# Pre-training data: a tokenizer, shards; Gutenberg prepared apart and used for training only (--val_data names the
# other folder's held-out documents). WikiText's .raw file is read as text.
biglm tokenizer train --input $S/tinystories/TinyStories-train.head.txt,$S/gutenberg,$S/brown,$S/wikitext2/wiki.test.raw,$S/state_union \
    --vocab_size 8192 --limit_bytes 16000000 --out $W/tok
biglm data prepare $S/tinystories/TinyStories-train.head.txt $S/brown $S/inaugural $S/state_union \
    $S/wikitext2/wiki.test.raw $S/fineweb_edu_sample/fineweb_edu_sample.jsonl --tokenizer $W/tok --out $W/data/main --val_docs 20
biglm data prepare $S/gutenberg --tokenizer $W/tok --out $W/data/gut --val_docs 1
# The default recipe's shape (4 x 192, 1.57M non-embedding parameters), windows of 256, 2,800 steps of 32 windows
# (22.9M tokens, about an hour on 2 idle cores).
biglm pretrain --data $W/data/main=0.47,$W/data/gut=0.53 --val_data $W/data/main --tokenizer $W/tok \
    --out_dir $W/pretrain --steps 2800 --warmup_steps 100 --seq_len 256 --model.max_position_embeddings 512 \
    --log_every 50 --eval_every 400 --save_every 200 --eval_windows 128

# Fine-tuning, one thread each (the two run side by side on a 2-core machine). lr 5e-4: the paper's 5e-5 is for
# 136M+ parameters; this model is ~1/85 of that.
FT="--lr 5e-4 --global_batch 32 --micro_batch 16"
OMP_NUM_THREADS=1 biglm finetune xsum --model $W/pretrain --task.train $D/xsum/test.subset1000.jsonl \
    --task.validation '' --task.validation_fraction 0.1 --task.max_source_length 192 --task.max_target_length 64 \
    --task.long_targets drop --epochs 12 $FT --out_dir $W/ft-xsum &
OMP_NUM_THREADS=1 biglm finetune squad-qg --model $W/pretrain --task.train $D/squad_qg/dev.jsonl \
    --task.validation $D/squad_qg/test.jsonl --task.source_template $'{src}\nQuestion:' --task.target_template '{tgt}' \
    --task.max_source_length 128 --task.max_target_length 48 --task.long_targets drop --task.max_eval_examples 300 \
    --epochs 4 $FT --out_dir $W/ft-squad-qg &
wait

# Instruction tuning on the FLAN-style mixture (MNLI + XSum rows under FLAN v2 patterns; no evaluation set in it),
# the paper's 5 epochs and linear decay, best epoch on the held-in 5%.
OMP_NUM_THREADS=2 biglm finetune flan --model $W/pretrain --task.mixture docs/examples/flan_demo_mix.yaml \
    --task.max_source_length 192 --task.max_target_length 48 --task.long_targets drop --epochs 5 $FT --out_dir $W/ft-flan
# The compared alternative of instruction tuning: the same tuning with the length head instead of EOS padding (Genset only).
OMP_NUM_THREADS=1 biglm finetune flan --model $W/pretrain --task.mixture docs/examples/flan_demo_mix.yaml \
    --task.max_source_length 192 --task.max_target_length 48 --task.long_targets drop --task.length_mode head \
    --epochs 5 $FT --out_dir $W/ft-flan-head
biglm eval --suite multitask --suite_tasks Genset --data_dir ../shared/data/eval \
    --model_args pretrained=$W/ft-flan-head/best --output_path $W/multitask-flan-head
# Table 5's row for the EOS-padded model; --limit keeps the CPU time to minutes (a quick check: the table says so).
biglm eval --suite multitask --data_dir ../shared/data/eval --model_args pretrained=$W/ft-flan/best \
    --limit 40 --output_path $W/multitask-flan

# The pre-trained model through the same suite: the peer that shows what the FLAN tuning changed.
biglm eval --suite multitask --data_dir ../shared/data/eval --model_args pretrained=$W/pretrain \
    --limit 40 --output_path $W/multitask-base

# Quality against speed for T = 4/10/16, with the LEAD-1 / copy-the-source row: SQuAD-QG's first 300 test rows (its
# validation rows), and XSum's 100 held-out rows (the split `--task.validation_fraction 0.1` made, seed 0).
python benchmarks/bench_seq2seq.py --mode quality --model $W/ft-squad-qg/best --data $D/squad_qg/test.jsonl \
    --examples 300 --steps 4 10 16 --batch 1 32 --threads 1 --out seq2seq-quality-qg-demo9
python - "$D/xsum/test.subset1000.jsonl" "$W/xsum_heldout.jsonl" <<'PY'
import json, random, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
order = list(range(len(rows)))
random.Random(0).shuffle(order)  # biglm.finetune.tasks.seq2seq's held-out split
held = set(order[:round(0.1 * len(rows))])
with open(sys.argv[2], "w") as f:
    f.writelines(json.dumps(r) + "\n" for i, r in enumerate(rows) if i in held)
PY
python benchmarks/bench_seq2seq.py --mode quality --model $W/ft-xsum/best --data $W/xsum_heldout.jsonl \
    --examples 100 --steps 4 10 16 --batch 1 32 --threads 1 --out seq2seq-quality-xsum-demo9
