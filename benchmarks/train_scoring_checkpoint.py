"""Train a small BiGLM on CPU so the scoring estimators can be compared on a *trained* model.

Stop-gap for docs/scoring.md while `biglm pretrain` does not exist yet: a byte-level BPE
tokenizer (biglm.data.tokenizer) and a 4-layer BiGLM trained with the paper's objective
(`biglm.objective.mask_batch` + `masked_lm_loss`) on the local pre-training text, for a fixed
wall-clock budget, then saved as a Hugging Face directory (save_pretrained + tokenizer) that
`biglm.checkpoint.load_model` and `biglm eval` read.

    python benchmarks/train_scoring_checkpoint.py --out runs/scoring-ckpt --seconds 600

A model this small trained for minutes is near chance on the zero-shot suite; it is meant for
comparing the estimators' cost and relative behaviour, not for reproducing the paper's numbers.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from biglm import BiGLMConfig, BiGLMForMaskedLM
from biglm.data.tokenizer import train_tokenizer
from biglm.objective import get_objective, mask_batch, masked_lm_loss

REPO = Path(__file__).resolve().parents[1]
PRETRAIN = REPO.parent / "shared" / "data" / "pretrain"


def _texts() -> list[str]:
    """TinyStories (original case) + WikiText-2 test + a few Gutenberg books: mixed prose."""
    files = [PRETRAIN / "tinystories" / "TinyStories-train.head.txt",
             PRETRAIN / "tinystories" / "TinyStories-valid.head.txt",
             PRETRAIN / "wikitext2" / "wiki.test.raw",
             *sorted((PRETRAIN / "gutenberg").glob("*.txt"))[:6]]
    docs: list[str] = []
    for f in files:
        docs += [d.strip() for d in f.read_text(encoding="utf-8").split("\n\n") if d.strip()]
    return docs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "runs" / "scoring-ckpt"))
    ap.add_argument("--seconds", type=float, default=600.0, help="wall-clock training budget")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    out = Path(args.out)

    docs = _texts()
    tok = train_tokenizer(texts=docs, vocab_size=8192)
    ids: list[int] = []
    for d in docs:
        ids += tok(d, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    data = torch.tensor(ids, dtype=torch.long)
    n_win = data.numel() // args.seq_len
    windows = data[: n_win * args.seq_len].view(n_win, args.seq_len)
    print(f"{len(docs)} docs, {data.numel():,} tokens, {n_win} windows of {args.seq_len}")

    config = BiGLMConfig(vocab_size=len(tok), hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         attn_backend="sdpa", pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, mask_token_id=tok.mask_token_id)
    model = BiGLMForMaskedLM(config).train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    objective = get_objective("biglm")
    # the number of steps is unknown (time budget): estimate it after 20 steps for the cosine schedule
    step, t0, total_steps, losses = 0, time.time(), None, []
    while True:
        elapsed = time.time() - t0
        if elapsed > args.seconds:
            break
        if step == 20:
            total_steps = int(args.seconds / (elapsed / 20))
        warm = 50
        frac = min(1.0, step / warm) if step < warm else 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warm) / max(1, (total_steps or 10**9) - warm))))
        for g in opt.param_groups:
            g["lr"] = args.lr * max(frac, 0.1)
        g_ = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
        rows = torch.randint(0, n_win, (args.batch,), generator=g_)
        batch = mask_batch(windows[rows], objective, mask_token_id=config.mask_token_id, seed=args.seed, step=step)
        logits = model(batch.input_ids, prefix_len=batch.prefix_len, labels=batch.labels).logits
        loss = masked_lm_loss(logits, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss))
        if step % 50 == 0:
            print(f"step {step} loss {loss.item():.3f} {time.time() - t0:.0f}s", flush=True)
        step += 1
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "train_info.json").write_text(json.dumps({
        "steps": step, "seconds": time.time() - t0, "seq_len": args.seq_len, "batch": args.batch,
        "tokens_seen": step * args.batch * args.seq_len, "final_loss_mean_last50": sum(losses[-50:]) / max(1, len(losses[-50:])),
        "corpus_tokens": int(data.numel()), "torch": torch.__version__}, indent=2))
    print(f"saved to {out} after {step} steps")


if __name__ == "__main__":
    main()
