"""Fine-tuning step throughput: biglm's loop (`FineTuner.train_step`, classification by prompt) against
transformers' own `Trainer` fine-tuning a same-shape ModernBERT (`ModernBertForSequenceClassification`) on
the same task, the same examples in the same batches (MNLI train subset, the same prompt token ids).

    python benchmarks/bench_finetune.py --layers 2 --steps 20 --threads 1

Both models: biglm-124m's shape (12 heads = 12 kv heads, so ModernBERT, which has no GQA, matches it
exactly) cut to ``--layers``, the same tokenizer and vocabulary, fp32 on CPU, global batch 32 in micro
batches of 8, AdamW, clipping 1.0. Timed: ``--steps`` optimizer steps after ``--warmup`` untimed ones;
biglm is timed twice: its default loop (each global batch sorted by length before it is cut into micro batches:
the same items and loss per step, less padding) and with ``group_by_length`` off (micro batches cut in the drawn
order, as the HF side gets them). The HF side is timed with a `TrainerCallback` from the first timed step's start to the last one's end, so
Trainer's own per-step work (its dataloader, collator, logging bookkeeping) is in, as for biglm's loop.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from common import write_result

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "finetune" / "mnli"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", default=str(SHARED / "train_subset_300.jsonl"))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import (ModernBertConfig, ModernBertForSequenceClassification, Trainer, TrainerCallback,
                              TrainingArguments)

    from biglm import BiGLMConfig, BiGLMForMaskedLM
    from biglm.data import train_tokenizer
    from biglm.finetune.tasks.classification import ClassificationSettings, ClassificationTask
    from biglm.finetune.config import FinetuneConfig
    from biglm.finetune.loop import FineTuner
    from biglm.training.distributed import DistInfo

    tmp = Path(tempfile.mkdtemp(prefix="bench_finetune_"))
    rows = [json.loads(line) for line in Path(args.train).read_text().splitlines() if line.strip()]
    texts = [f"{r['premise']} {r['hypothesis']} True False Neither" for r in rows]
    tok = train_tokenizer(texts=texts * 3, vocab_size=4096, out_dir=str(tmp / "tok"))
    c = BiGLMConfig.from_preset("biglm-124m", num_hidden_layers=args.layers, vocab_size=len(tok), attn_backend="sdpa",
                                max_position_embeddings=512, pad_token_id=tok.pad_token_id, mask_token_id=tok.mask_token_id,
                                eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
    torch.manual_seed(0)
    BiGLMForMaskedLM(c).save_pretrained(tmp / "model")
    tok.save_pretrained(tmp / "model")

    # ---- biglm: the real loop's train_step
    task = ClassificationTask(ClassificationSettings(train=args.train, validation=args.train, template="mnli",
                                                     max_length=256), name="mnli")
    def biglm_step_s(group_by_length: bool) -> tuple[float, FineTuner]:
        cfg = FinetuneConfig(model=str(tmp / "model"), out_dir=str(tmp / f"run-{group_by_length}"), epochs=100,
                             global_batch=args.global_batch, micro_batch=args.micro_batch, device="cpu", dtype="fp32",
                             compile="no", log_every=10**9, group_by_length=group_by_length)
        tuner = FineTuner(task, cfg, info=DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu")),
                          echo=lambda s: None)
        for _ in range(args.warmup):
            tuner.train_step()
        t = time.perf_counter()
        for _ in range(args.steps):
            tuner.train_step()
        return (time.perf_counter() - t) / args.steps, tuner

    # the default loop (each global batch sorted by length before micro-batching) and the same loop cutting the
    # drawn order as it is, which is what the HF side does
    biglm_s, tuner = biglm_step_s(True)
    biglm_ungrouped_s, _ = biglm_step_s(False)
    features = task.train_features()
    mean_len = sum(len(f["prompt_ids"]) + 1 for f in features) / len(features)

    # ---- transformers Trainer + ModernBERT on the same examples in the same order
    mc = ModernBertConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                          num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
                          max_position_embeddings=512, global_attn_every_n_layers=1, num_labels=3,
                          pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                          cls_token_id=tok.bos_token_id, sep_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    hf_model = ModernBertForSequenceClassification(mc)
    total = (args.warmup + args.steps) * args.global_batch
    order = [int(i) for e in range(total // len(features) + 1) for i in tuner.order(e)][:total]
    hf_rows = [{"input_ids": features[i]["prompt_ids"] + [tok.mask_token_id], "labels": features[i]["label"]} for i in order]

    class Fixed(torch.utils.data.Dataset):
        def __len__(self):
            return len(hf_rows)

        def __getitem__(self, i):
            return hf_rows[i]

    marks: dict[str, float] = {}

    class Clock(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            if state.global_step == args.warmup:
                marks["start"] = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            marks["end"] = time.perf_counter()

    from transformers import DataCollatorWithPadding

    targs = TrainingArguments(output_dir=str(tmp / "hf"), per_device_train_batch_size=args.micro_batch,
                              gradient_accumulation_steps=args.global_batch // args.micro_batch,
                              max_steps=args.warmup + args.steps, learning_rate=2e-5, max_grad_norm=1.0, report_to=[],
                              save_strategy="no", logging_strategy="no", use_cpu=True, dataloader_num_workers=0,
                              seed=0, data_seed=0)
    class InOrder(Trainer):  # the rows are already in biglm's order: no reshuffling
        def _get_train_sampler(self, *a, **k):
            return torch.utils.data.SequentialSampler(self.train_dataset)

    trainer = InOrder(model=hf_model, args=targs, train_dataset=Fixed(), data_collator=DataCollatorWithPadding(tok),
                      callbacks=[Clock()])
    trainer.train()
    hf_s = (marks["end"] - marks["start"]) / args.steps
    row = {"layers": args.layers, "hidden": c.hidden_size, "global_batch": args.global_batch, "micro_batch": args.micro_batch,
           "mean_tokens_per_example": round(mean_len, 1), "steps": args.steps,
           "biglm_s_per_step": biglm_s, "biglm_examples_per_s": args.global_batch / biglm_s,
           "hf_trainer_modernbert_s_per_step": hf_s, "hf_trainer_modernbert_examples_per_s": args.global_batch / hf_s,
           "ratio_biglm_over_hf": hf_s / biglm_s,
           "biglm_no_grouping_s_per_step": biglm_ungrouped_s, "ratio_biglm_no_grouping_over_hf": hf_s / biglm_ungrouped_s}
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
    print("wrote", write_result("finetune", {"args": vars(args), "rows": [row]}, stem=args.out))


if __name__ == "__main__":
    main()
