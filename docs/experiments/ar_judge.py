"""Issue 21's TinyStories judge: a same-size autoregressive Llama trained (transformers) on the same shards scores
the continuations the BiGLM variants wrote, so generation quality is not judged by the model that wrote it.

    python docs/experiments/ar_judge.py --data TS_DATA --tokenizer TS_TOK --samples samples.json --out judged.json

``samples.json``: {model: {setting: [[prompt ids, continuation ids], ...]}} (blocks_quality_eval.py --dump).
The held-out gold continuations are scored too (key "gold"), as the scale. GPU if there is one; a few minutes.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F


def stream(data: Path, split: str) -> np.ndarray:
    from biglm.data.shards import ShardReader

    docs = []
    for path in sorted(data.glob(f"{split}-*.bin")):
        shard = ShardReader(path, expected_vocab_size=None)
        docs += [shard.doc(i).astype("int64") for i in range(len(shard))]
    return np.concatenate(docs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--samples", type=Path, default=None, help="continuations to score (omit: only train)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--save", type=Path, default=None, help="also save the trained AR model + tokenizer here (issue 23)")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=256)
    args = ap.parse_args()
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    torch.manual_seed(0)
    # the BiGLM default recipe's shape (4 x 192, GQA 6/2, MLP 512), tied embeddings: the same size as the writers
    config = LlamaConfig(vocab_size=len(tok), hidden_size=192, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id)
    model = LlamaForCausalLM(config).to(dev)
    train, val = stream(args.data, "train"), stream(args.data, "val")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.01)
    rng = np.random.default_rng(0)
    t0 = time.time()
    for step in range(args.steps):  # same tokens as each BiGLM run: steps x batch x seq_len
        lr = 3e-3 * min(1.0, (step + 1) / 40) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
        for group in opt.param_groups:
            group["lr"] = lr
        starts = rng.integers(0, len(train) - args.seq_len - 1, args.batch)
        x = torch.tensor(np.stack([train[s:s + args.seq_len] for s in starts]), device=dev)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    model.eval()
    with torch.no_grad():
        starts = np.arange(0, len(val) - args.seq_len - 1, args.seq_len)[:256]
        x = torch.tensor(np.stack([val[s:s + args.seq_len] for s in starts]), device=dev)
        val_loss = float(model(input_ids=x, labels=x).loss)

    @torch.no_grad()
    def nll(pairs: list[list[list[int]]]) -> list[float]:
        out = []
        for prompt, cont in pairs:
            if not cont:
                continue
            ids = torch.tensor([prompt + cont], device=dev)
            logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
            out.append(float(F.cross_entropy(logits, ids[0, len(prompt):], reduction="mean")))
        return out

    if args.save:
        model.save_pretrained(args.save)
        tok.save_pretrained(args.save)
    if args.samples is None:
        print(json.dumps({"val_loss": val_loss, "train_seconds": time.time() - t0}))
        return
    samples = json.loads(args.samples.read_text())
    judged = {"judge": {"train_steps": args.steps, "tokens": args.steps * args.batch * args.seq_len,
                        "val_loss": val_loss, "train_seconds": time.time() - t0, "device": str(dev)}}
    for name, settings in samples.items():
        judged[name] = {}
        for setting, pairs in settings.items():
            scores = nll(pairs)
            judged[name][setting] = {"ar_nll_per_token": statistics.mean(scores), "n": len(scores),
                                     "stderr": statistics.stdev(scores) / math.sqrt(len(scores))}
    args.out.write_text(json.dumps(judged, indent=1))
    print(json.dumps(judged, indent=1))


if __name__ == "__main__":
    main()
