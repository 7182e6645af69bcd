#!/usr/bin/env bash
# The issue-8 CPU demonstration (docs/LOG.md): fine-tune runs/demo/pretrain on MNLI, SQuAD and SciFact.
set -euxo pipefail
cd "$(dirname "$0")/../.."
biglm finetune classification --model runs/demo/pretrain --task.train ../shared/data/finetune/mnli/train_subset_300.jsonl --task.validation ../shared/data/finetune/mnli/validation_matched.jsonl --task.template docs/examples/mnli_yes_no.yaml --task.validation_name MNLI-m --epochs 5 --lr 1e-4 --global_batch 16 --micro_batch 16 --eval_batch_size 64 --log_every 5 --out_dir runs/demo/ft-mnli
biglm finetune squad --model runs/demo/pretrain --task.train ../shared/data/finetune/squad_v1.1/dev-v1.1.reconstructed.json --task.split_by_article 0.2 --task.max_train_examples 2000 --task.max_eval_examples 500 --epochs 2 --lr 1e-4 --global_batch 32 --micro_batch 16 --log_every 10 --out_dir runs/demo/ft-squad
biglm finetune beir-scifact --model runs/demo/pretrain --task.data ../shared/data/finetune/beir_scifact --epochs 3 --lr 1e-4 --log_every 5 --out_dir runs/demo/ft-scifact
