"""Issue 21, feasibility sketch of speculative decoding (before `generation/speculative.py`): uncached, two passes per
"call" (draft a block of m+1 masks after the answer so far, then check each draft with one mask after it), counted as
one call, so it is optimistic: the library drafts in the same pass as the checks, one token staler (docs/LOG.md).

    python docs/experiments/speculative_sketch.py MODEL_DIR DATA_DIR PROMPTS
"""
import statistics
import sys

import torch
ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks")); sys.path.insert(0, str(ROOT / "docs" / "experiments"))
from synthetic_grammar import check
from blocks_quality_eval import prompts
from biglm.checkpoint import load_model
torch.set_num_threads(1)
model, tok = load_model(sys.argv[1]); model = model.float().eval()
M = tok.mask_token_id
P = prompts(__import__("pathlib").Path(sys.argv[2]), n=int(sys.argv[3]), prompt_len=24, new=64)
def logits(x, n_mask, plen):
    ids = torch.tensor([x + [M] * n_mask])
    with torch.inference_mode():
        out = model(ids, prefix_len=len(x), prompt_len=plen, block_len=1)
    return out.logits[0, len(x):].float()
def run(prompt, m, rule, eps=0.3, delta=0.09):
    x = list(prompt); plen = len(x); calls = 0; accepted = []
    while len(x) - plen < 64:
        drafts = logits(x, m + 1, plen).argmax(-1).tolist()
        calls += 1; a = 0
        while True:
            p = logits(x + drafts[:a], 1, plen)[0].softmax(-1)
            g = int(p.argmax())
            if a <= m and rule(p, drafts[a], eps, delta) and a < m + 1:
                a += 1
                if a == m + 1: break
                continue
            break
        new = drafts[:a] + ([g] if a <= m else [])
        accepted.append(len(new)); x += new
    ans = x[plen:plen + 64]
    c = check(tok.decode(prompt, skip_special_tokens=True), tok.decode(ans, skip_special_tokens=True))
    return calls, c["grammatical"], c["sentences"]
exact = lambda p, d, e, dl: int(p.argmax()) == d
def typical(p, d, eps, delta):
    H = -(p * p.clamp_min(1e-12).log()).sum()
    return float(p[d]) > min(eps, delta * float(torch.exp(-H)))  # Medusa's typical acceptance
ratio = lambda p, d, e, dl: float(p[d]) >= e * float(p.max())
res = {}
for m in (3, 7):
    for name, rule, e, dl in (("exact", exact, 0, 0), ("typical .3/.09", typical, .3, .09), ("ratio .5", ratio, .5, 0), ("ratio .2", ratio, .2, 0)):
        calls, g, s = [], 0, 0
        for pr in P.tolist():
            c, gg, ss = run(pr, m, rule, e, dl); calls.append(c); g += gg; s += ss
        res[f"m={m} {name}"] = dict(mean_calls=statistics.mean(calls), tokens_per_call=64/statistics.mean(calls), grammatical=g/max(1,s))
        print(f"m={m} {name}: calls {statistics.mean(calls):.1f}  tok/call {64/statistics.mean(calls):.2f}  grammatical {g/max(1,s):.3f}", flush=True)
