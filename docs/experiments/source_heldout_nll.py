"""The AR source's own continuation NLL on `biglm eval --suite heldout`'s documents (issue 32's table: the row the
BiGLM's chain-rule continuation NLL is compared with). Same requests (`scoring.heldout.continuation_requests`: the
second half of each of the first DOCS held-out documents, up to 32 tokens, given up to 64 tokens of its first half),
scored left to right by the source:

    python docs/experiments/source_heldout_nll.py --source runs/bevh-b1/source-hf --data runs/data-smol-mix --docs 30
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", required=True, help="the AR source as a transformers directory")
    ap.add_argument("--data", required=True, help="a folder written by `biglm data prepare --val_docs N`")
    ap.add_argument("--docs", type=int, default=30)
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM

    from biglm.data.mixture import TokenDataset
    from biglm.scoring.heldout import continuation_requests

    model = AutoModelForCausalLM.from_pretrained(args.source, dtype=torch.float32).eval()
    dataset = TokenDataset(args.data, split="val", expected_vocab_size=None)
    requests = continuation_requests(dataset, docs=args.docs, context_tokens=64, continuation_tokens=32)
    nll, tokens = [], []
    with torch.inference_mode():
        for ctx, cont in requests:
            ids = torch.tensor([ctx + cont])
            logp = model(ids).logits[0, len(ctx) - 1:-1].float().log_softmax(-1)
            nll.append(-float(logp.gather(1, torch.tensor(cont)[:, None]).sum()))
            tokens.append(len(cont))
    per_doc = np.array(nll) / np.array(tokens)
    mean = sum(nll) / sum(tokens)
    print(f"source continuation NLL {mean:.4f} ± {per_doc.std(ddof=1) / math.sqrt(len(per_doc)):.4f} "
          f"(ppl {math.exp(mean):.2f}) over {len(requests)} documents, {sum(tokens)} tokens")


if __name__ == "__main__":
    main()
