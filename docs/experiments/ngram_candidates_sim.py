"""Offline: tokens per call of prompt-lookup (n-gram) drafts checked one candidate at a time vs the best of k
candidates per call (a tree of drafts), and with a corpus datastore (REST-style), on one token per call's own answers
(what exact drafts must match): the 12 held-out prompts of `bench_exact_drafts` and the 4 of `bench_serve_vs_vllm`
(docs/LOG.md 2026-11-27, afternoon). A draft of m tokens is kept up to its first miss; a call writes kept + 1.

    python docs/experiments/ngram_candidates_sim.py --model runs/smol-a40-bf16 --corpus runs/data-smol-mix/train-00000.bin
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
from bench_exact_drafts import prompt_rows  # noqa: E402
from bench_serve_vs_vllm import PROMPTS  # noqa: E402

from biglm.checkpoint.loading import load_model  # noqa: E402
from biglm.generation import DecodingConfig, generate_ids  # noqa: E402
from biglm.generation.chat import render_chat  # noqa: E402


def own(history: list[int], m: int, k: int, max_n: int = 3) -> list[list[int]]:
    """Up to k distinct continuations of the text's own latest matches, longest n-gram first."""
    L, out = len(history), []
    for n in range(min(max_n, L - 1), 0, -1):
        suffix = history[L - n:]
        for s in range(L - n - 1, -1, -1):
            if history[s:s + n] == suffix:
                c = history[s + n:s + n + m]
                if c and c not in out:
                    out.append(c)
                    if len(out) >= k:
                        return out
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--corpus", default=None, help="a uint16 token shard (biglm data prepare) for the datastore")
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data"))
    ap.add_argument("--max-new-tokens", type=int, default=96)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, tok = load_model(args.model, pack=True)
    texts = [r["prompt"] if "prompt" in r else render_chat(tok, r["messages"]) for r in prompt_rows(Path(args.data), 4)]
    cfg = DecodingConfig(strategy="confidence", block_length=1, steps=args.max_new_tokens,
                         max_new_tokens=args.max_new_tokens, draft_length=0)
    data = []
    for t in texts + PROMPTS:
        ids = tok(t, add_special_tokens=False)["input_ids"]
        data.append((ids, generate_ids(model, torch.tensor([ids]), config=cfg).token_lists()[0]))
    tables = []
    if args.corpus:
        corpus = np.fromfile(args.corpus, dtype=np.uint16).astype(np.int64).tolist()
        for n in (3, 2):
            table = collections.defaultdict(collections.Counter)
            for i in range(len(corpus) - n - 4):
                table[tuple(corpus[i:i + n])][tuple(corpus[i + n:i + n + 4])] += 1
            tables.append((n, table))

    def from_corpus(history: list[int], k: int) -> list[list[int]]:
        out = []
        for n, table in tables:
            for cont, _ in table.get(tuple(history[-n:]), collections.Counter()).most_common(k):
                if list(cont) not in out:
                    out.append(list(cont))
        return out[:k]

    def tokens_per_call(drafts) -> float:
        calls = tokens = 0
        for prompt, answer in data:
            t = 0
            while t < len(answer):
                best = 0
                for c in drafts(prompt + answer[:t]):
                    a = 0
                    while a < len(c) and t + a < len(answer) and c[a] == answer[t + a]:
                        a += 1
                    best = max(best, a)
                t += best + 1
                calls += 1
            tokens += len(answer)
        return tokens / calls

    for m in (4, 6):
        print(f"m={m}: " + ", ".join(f"k={k} {tokens_per_call(lambda h, k=k: own(h, m, k)):.2f}" for k in (1, 2, 3, 4, 8)))
    if tables:
        print("corpus alone (k=1): %.2f" % tokens_per_call(lambda h: from_corpus(h, 1)))
        for k in (1, 2, 3):
            print(f"own k={k} + corpus k={k}: %.2f" % tokens_per_call(lambda h, k=k: own(h, 4, k) + from_corpus(h, k)))


if __name__ == "__main__":
    main()
