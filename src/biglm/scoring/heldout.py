"""Held-out language-modelling metrics of a BiGLM on prepared token shards (`biglm eval --suite heldout`): what a
small model shows where the zero-shot suite sits at chance (Table 1 at micro scale reads them).

- ``masked_loss`` and ``fill_acc``: the BiGLM objective's masks and attention (α = 0.2, β_Y ~ U(0,1),
  β_X = 0.3 − 0.2·β_Y, the prefix blind to the suffix: the condition generation runs under) on the first
  ``windows`` fixed windows of the folder's ``val`` split, masks drawn once from ``seed`` so every model compared
  sees the same ones: mean cross-entropy over the masked tokens, and the share whose argmax is the original token.
- ``cont_nll`` and ``cont_ppl``: the exact chain-rule log-likelihood (`estimators.score_requests`, ``chain``) of
  each held-out document's second half given its first (up to ``context_tokens`` before the middle token, up to
  ``continuation_tokens`` after it): per-token NLL in nats, and its exp, a real perplexity.

Standard errors are over windows (masked metrics) and documents (continuation). Results use lm-eval's layout
(``results.heldout["masked_loss,none"]``, ``..._stderr,none``), so `biglm report` and lm-eval tooling read them.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..objective import apply_masks, draw_masks, get_objective, make_generator
from .estimators import score_requests

TASK = "heldout"
METRICS = ("masked_loss", "fill_acc", "cont_nll", "cont_ppl")


def _stderr(values: np.ndarray) -> float:
    return float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else float("nan")


@torch.no_grad()
def masked_metrics(model: Any, dataset: Any, *, windows: int, seq_len: int, seed: int, batch_size: int = 16
                   ) -> dict[str, float]:
    """Masked loss and fill-in accuracy at the BiGLM setting on the first ``windows`` windows of ``dataset``."""
    from ..data.mixture import iter_windows

    device = next(model.parameters()).device
    objective = get_objective("biglm")
    n = min(windows, dataset.n_tokens // seq_len)
    if n < 2:
        raise ValueError(f"{dataset.name}: the val split holds {dataset.n_tokens} tokens, fewer than two "
                         f"{seq_len}-token windows; prepare more held-out documents (--val_docs) or lower --heldout_seq_len")
    pattern = draw_masks(n, seq_len, objective, generator=make_generator(seed=seed, step=0, rank=0, device=device),
                         device=device, vocab_size=model.config.vocab_size)
    mask_id = int(model.config.mask_token_id)
    losses, accs, counts = [], [], []
    start = 0
    for win in iter_windows(dataset, window=seq_len, batch_size=batch_size, max_windows=n):
        win = win.to(device)
        rows = torch.arange(start, start + len(win), device=device)
        start += len(win)
        batch = apply_masks(win, pattern.rows(rows), mask_token_id=mask_id).find_positions()
        out = model(batch.input_ids, prefix_len=batch.prefix_len, logits_positions=batch.positions)
        targets = batch.labels.reshape(-1).index_select(0, batch.positions)
        ce = torch.nn.functional.cross_entropy(out.logits.float(), targets, reduction="none")
        hit = (out.logits.argmax(-1) == targets).float()
        row_of = batch.positions // seq_len
        k = torch.bincount(row_of, minlength=len(win)).float()
        losses.append(torch.zeros(len(win), device=device).index_add_(0, row_of, ce).cpu())
        accs.append(torch.zeros(len(win), device=device).index_add_(0, row_of, hit).cpu())
        counts.append(k.cpu())
    loss, acc, k = torch.cat(losses).numpy(), torch.cat(accs).numpy(), torch.cat(counts).numpy()
    return {"masked_loss": float(loss.sum() / k.sum()), "masked_loss_stderr": _stderr(loss / np.maximum(k, 1)),
            "fill_acc": float(acc.sum() / k.sum()), "fill_acc_stderr": _stderr(acc / np.maximum(k, 1)),
            "windows": float(n), "masked_tokens": float(k.sum())}


def continuation_requests(dataset: Any, *, docs: int, context_tokens: int, continuation_tokens: int
                          ) -> list[tuple[list[int], list[int]]]:
    """(first half, second half) of the first ``docs`` held-out documents with at least 8 tokens, cut at the middle."""
    out = []
    for reader in dataset.readers:
        for i in range(reader.n_docs):
            d = [int(t) for t in reader.doc(i)]
            if d and d[-1] == dataset.eos_id:
                d = d[:-1]
            if len(d) < 8:
                continue
            mid = len(d) // 2
            out.append((d[max(0, mid - context_tokens):mid], d[mid:mid + continuation_tokens]))
            if len(out) == docs:
                return out
    return out


def heldout_metrics(model: Any, *, data: str | Path, windows: int = 256, seq_len: int = 128, docs: int = 200,
                    context_tokens: int = 64, continuation_tokens: int = 32, seed: int = 0,
                    batch_size: int = 16) -> dict[str, float]:
    """All held-out metrics of ``model`` (eval mode) on the ``val`` split of the prepared folder ``data``."""
    from ..data.mixture import TokenDataset

    if seq_len > model.config.max_position_embeddings:
        raise ValueError(f"--heldout_seq_len {seq_len} exceeds the model's max_position_embeddings="
                         f"{model.config.max_position_embeddings}")
    if context_tokens + continuation_tokens > model.config.max_position_embeddings:
        raise ValueError("context_tokens + continuation_tokens exceed the model's window")
    dataset = TokenDataset(data, split="val", expected_vocab_size=model.config.vocab_size)
    out = masked_metrics(model, dataset, windows=windows, seq_len=seq_len, seed=seed, batch_size=batch_size)
    requests = continuation_requests(dataset, docs=docs, context_tokens=context_tokens,
                                     continuation_tokens=continuation_tokens)
    if len(requests) < 2:
        raise ValueError(f"{data}: fewer than two held-out documents of at least 8 tokens for the continuation metric")
    scores = score_requests(model, requests, estimator="chain", batch_size=batch_size)
    nll = np.array([-ll for ll, _ in scores])
    n_tok = np.array([len(c) for _, c in requests], dtype=np.float64)
    per_doc = nll / n_tok
    out.update(cont_nll=float(nll.sum() / n_tok.sum()), cont_nll_stderr=_stderr(per_doc),
               cont_ppl=float(math.exp(nll.sum() / n_tok.sum())), docs=float(len(requests)),
               continuation_tokens=float(n_tok.sum()))
    # delta method: se(exp(x)) ≈ exp(x)·se(x)
    out["cont_ppl_stderr"] = out["cont_ppl"] * out["cont_nll_stderr"]
    return out


def run_heldout(pretrained: str | Path, *, data: str | Path, output_path: str | Path | None = None,
                device: str | None = None, **settings: Any) -> dict[str, Any]:
    """Load ``pretrained`` (export or run dir), compute `heldout_metrics`, and return (and with ``output_path``
    write to ``<output_path>/heldout.json``) the results in lm-eval's layout."""
    from ..checkpoint import load_model

    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model, tokenizer = load_model(pretrained, device=dev, pack=True)
    t0 = time.perf_counter()
    values = heldout_metrics(model, data=data, **settings)
    task: dict[str, Any] = {"alias": TASK}
    for m in METRICS:
        task[f"{m},none"] = values[m]
        task[f"{m}_stderr,none"] = values[f"{m}_stderr"]
    result = {
        "results": {TASK: task},
        "n-samples": {TASK: {"windows": int(values["windows"]), "docs": int(values["docs"])}},
        "config": {"model": "biglm", "model_args": f"pretrained={pretrained}", "data": str(data),
                   "settings": {k: v for k, v in settings.items()}, "masked_tokens": values["masked_tokens"],
                   "continuation_tokens": values["continuation_tokens"],
                   "tokenizer": getattr(tokenizer, "name_or_path", None)},
        "biglm_suite": {"suite": TASK, "seconds": round(time.perf_counter() - t0, 1)},
    }
    if output_path is not None:
        out = Path(output_path)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{TASK}.json").write_text(json.dumps(result, indent=2))
    return result


def format_heldout(result: dict[str, Any]) -> str:
    """A one-table Markdown view of `run_heldout`'s result."""
    r = result["results"][TASK]
    lines = ["| metric | value | ± stderr |", "|---|---|---|"]
    for m in METRICS:
        lines.append(f"| {m} | {r[f'{m},none']:.4f} | {r[f'{m}_stderr,none']:.4f} |")
    return "\n".join(lines)
