"""The closing report of the built-in run (`biglm pretrain` with no recipe): what the model learned that word
frequency alone does not give.

A few minutes of CPU training leave a model whose favourite guess for a hole is still often a frequent word, so the
report puts it beside the unigram baseline (the training set's word frequencies, blind to context) on the same holes:
- the validation loss against the unigram loss (the run's own fixed held-out masks);
- hidden words in held-out windows (15% of the tokens, seeded, replaced by ``<mask>``, the rest visible): the gold
  token's rank and probability under both: share ranked first, share in the top 5, median rank, mean probability;
- holes where context decides the word (gold tokens the unigram ranks beyond `RARE_RANK`): their median rank under
  both, how many the model ranks in its `TOP`, and a few found in text that reads as prose (`is_prose`: the built-in
  corpus also holds codec tables and code, where a "found" token shows only that a row repeats);
- fill-ins for `DEMO_SENTENCES`, written so that context decides the word: the model's top guesses and the needed
  word's rank, model against unigram.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

HIDE_RATE = 0.15
RARE_RANK = 100  # a gold token the unigram ranks beyond this: its frequency does not give it away
TOP = 5  # a context-decided word counts as found when the model ranks it this high
SHOW = 5
CONTEXT = 24  # tokens either side of a hole read to judge whether it sits in prose

# the small words of English sentences; a table row, a code line or a listing of names has few of them
FUNCTION_WORDS = frozenset(
    "a an the of to in on at by for from with as and or but not no is are was were be been it its this that these "
    "those if then than when which who what there can may will would should must has have had do does".split())
_WORD = re.compile(r"[A-Za-z]+(?:'[a-z]+)?")

# (sentence with <mask>, the word the context asks for): patterns the built-in corpus (Python's own docs) holds
DEMO_SENTENCES: tuple[tuple[str, str], ...] = (
    ("Return True if the path is a directory, <mask> otherwise.", "False"),
    ("Return <mask> if the object is callable, False otherwise.", "True"),
    ("Return a <mask> of all the keys in the dictionary.", "list"),
    ("Write the data to the stream and return the number of <mask> written.", "bytes"),
    ("for i in <mask>(10):", "range"),
)


@dataclass
class RankStats:
    """Where one predictor puts the gold token of each hidden position."""

    ranks: list[int] = field(default_factory=list)  # 1 = the predictor's first guess
    probs: list[float] = field(default_factory=list)

    def add(self, ranks: torch.Tensor, probs: torch.Tensor) -> None:
        self.ranks += ranks.tolist()
        self.probs += probs.tolist()

    def summary(self) -> dict[str, float]:
        r = torch.tensor(self.ranks, dtype=torch.float64)
        return {"first": float((r == 1).double().mean()) * 100, "top5": float((r <= 5).double().mean()) * 100,
                "median_rank": float(r.median()), "mean_prob": sum(self.probs) / len(self.probs)}


@dataclass
class HiddenWordTest:
    """The hidden-word test's result: the model's and the unigram's ranks, and the context-decided examples."""

    model: RankStats
    unigram: RankStats
    windows: int
    rare_model: list[int]  # the model's ranks of the hidden tokens the unigram ranks beyond RARE_RANK
    rare_unigram: list[int]  # ... and the unigram's
    examples: list[str]  # the first SHOW of those the model ranks in its TOP in prose, one per word, as
    # "... left [gold] right ... (ranks)"
    prose_found: int = 0  # how many of those the model ranks in its TOP are words in prose

    @property
    def rare_found(self) -> int:
        return sum(r <= TOP for r in self.rare_model)


def _ranks(logits: torch.Tensor, gold: torch.Tensor) -> torch.Tensor:
    """1 + the number of tokens scored strictly higher than the gold token, per row."""
    return 1 + (logits > logits.gather(1, gold[:, None])).sum(dim=1)


@torch.no_grad()
def hidden_word_test(model: torch.nn.Module, tokenizer, windows: list[torch.Tensor], *, unigram: torch.Tensor,
                     doc_ids=None, rate: float = HIDE_RATE, seed: int = 0) -> HiddenWordTest:
    """Hide ``rate`` of the (non-special) tokens of each held-out window, predict them with the rest visible, and
    rank the gold tokens under the model and under the ``unigram`` log-probabilities (see the module docstring).
    ``doc_ids(windows)`` gives the document of each token (attention stays inside documents; it or ``doc_ids``
    itself may be None: one document)."""
    model.eval()
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    special = torch.tensor(sorted(set(tokenizer.all_special_ids)))
    vocab = len(tokenizer)
    uni = unigram.float()[:vocab]
    out = HiddenWordTest(model=RankStats(), unigram=RankStats(), windows=0, rare_model=[], rare_unigram=[], examples=[])
    shown: set[str] = set()  # the words of the examples: one example each
    for ids in windows:
        hide = (torch.rand(ids.shape, generator=gen) < rate) & ~torch.isin(ids, special)
        if not hide.any():
            continue
        inputs = ids.masked_fill(hide, tokenizer.mask_token_id)
        flat = hide.flatten().nonzero().flatten()
        docs = doc_ids(ids) if doc_ids is not None else None
        logits = model(inputs.to(device), doc_ids=None if docs is None else docs.to(device),
                       logits_positions=flat.to(device)).logits.float().cpu()[:, :vocab]
        gold = ids.flatten()[flat]
        ranks = _ranks(logits, gold)
        uni_ranks = _ranks(uni.expand(len(gold), -1), gold)
        out.model.add(ranks, logits.softmax(-1).gather(1, gold[:, None]).squeeze(1))
        out.unigram.add(uni_ranks, uni[gold].exp())
        out.windows += ids.shape[0]
        rare = uni_ranks > RARE_RANK
        out.rare_model += ranks[rare].tolist()
        out.rare_unigram += uni_ranks[rare].tolist()
        for k in (rare & (ranks <= TOP)).nonzero().flatten().tolist():
            row, pos = divmod(int(flat[k]), ids.shape[1])
            word = tokenizer.decode([int(ids[row, pos])]).strip()
            lo, hi = _span(ids[row], pos, width=CONTEXT, eos=tokenizer.eos_token_id)
            if not (_WORD.fullmatch(word) and is_prose(tokenizer.decode(ids[row, lo:hi].tolist()))):
                continue  # a table cell, a code token or a word inside code
            out.prose_found += 1
            if word in shown or len(out.examples) >= SHOW:
                continue
            shown.add(word)
            out.examples.append(f"{_snippet(tokenizer, ids[row], hide[row], pos)}   (rank {int(ranks[k])} by the "
                                f"model, {int(uni_ranks[k])} by frequency)")
    return out


def is_prose(text: str) -> bool:
    """Whether ``text`` reads as running English rather than a table row, code or a listing: the report's examples
    come from prose, where a word found from its context shows what the model learned. Prose has at least 8 words,
    letters make most of what is not space (code and hex tables are punctuation and digits), few are capitals (a
    Unicode name table is all caps), few words repeat (a table repeats its column words), and the small words of
    sentences (`FUNCTION_WORDS`) are among them."""
    words = _WORD.findall(text)
    if len(words) < 8:
        return False
    letters = sum(map(len, words))
    low = [w.lower() for w in words]
    return (letters >= 0.75 * len(re.sub(r"\s", "", text))
            and sum(c.isupper() for w in words for c in w) <= 0.2 * letters
            and len(set(low)) >= 0.6 * len(low)
            and sum(w in FUNCTION_WORDS for w in low) >= 0.15 * len(low))


def _span(ids: torch.Tensor, pos: int, *, width: int, eos: int | None) -> tuple[int, int]:
    """``[lo, hi)`` around ``pos``: ``width`` tokens either side, cut at the document's ends (EOS)."""
    lo, hi = max(0, pos - width), min(len(ids), pos + width + 1)
    for i in range(pos - 1, lo - 1, -1):
        if int(ids[i]) == eos:
            lo = i + 1
            break
    for i in range(pos + 1, hi):
        if int(ids[i]) == eos:
            hi = i
            break
    return lo, hi


def _snippet(tokenizer, ids: torch.Tensor, hidden: torch.Tensor, pos: int, *, width: int = 8) -> str:
    """The held-out text around ``pos`` (the gold token in brackets; other hidden tokens shown as _), cut at
    document ends."""
    lo, hi = _span(ids, pos, width=width, eos=tokenizer.eos_token_id)

    def text(a: int, b: int) -> str:
        parts = [" _" if hidden[i] else tokenizer.decode([int(ids[i])]) for i in range(a, b)]
        return "".join(parts).replace("\n", " ")

    gold = tokenizer.decode([int(ids[pos])])
    lead = " " if gold.startswith(" ") else ""
    return f"...{text(lo, pos)}{lead}[{gold.strip()}]{text(pos + 1, hi)}..."


@torch.no_grad()
def fill_ins(model: torch.nn.Module, tokenizer, sentences=DEMO_SENTENCES, *, unigram: torch.Tensor,
             top_k: int = 3) -> list[tuple[list[str], int, int]]:
    """For each (sentence, word): the model's ``top_k`` guesses at the <mask> and the needed word's rank under the
    model and the unigram (its first token's), printed and returned."""
    model.eval()
    device = next(model.parameters()).device
    vocab = len(tokenizer)
    uni = unigram.float()[:vocab]
    results = []
    for text, word in sentences:
        before = text[:text.index("<mask>")]
        ids = tokenizer(text.replace("<mask>", tokenizer.mask_token), return_tensors="pt",
                        add_special_tokens=False)["input_ids"]
        pos = int((ids[0] == tokenizer.mask_token_id).nonzero()[0])
        gold = tokenizer((" " if before.endswith(" ") else "") + word, add_special_tokens=False)["input_ids"][0]
        logits = model(ids.to(device)).logits[0, pos].float().cpu()[:vocab]
        guesses = [tokenizer.decode([t]).strip() for t in logits.topk(top_k).indices.tolist()]
        gold_t = torch.tensor([gold])
        rank = int(_ranks(logits[None], gold_t)[0])
        uni_rank = int(_ranks(uni[None], gold_t)[0])
        results.append((guesses, rank, uni_rank))
        print(f"  {text}\n    -> {' / '.join(repr(g) for g in guesses)}   ({word!r}: rank {rank} by the model, "
              f"{uni_rank} by frequency)")
    return results


def demo_report(trainer, result) -> None:
    """The built-in run's ending (see the module docstring)."""
    from .data import unigram_log_probs, unigram_loss

    cfg, tok = trainer.cfg, trainer.tokenizer
    logp = unigram_log_probs(cfg, vocab_size=len(tok), fingerprint=trainer.data_fingerprint)
    base = unigram_loss(cfg, vocab_size=len(tok), fingerprint=trainer.data_fingerprint, logp=logp,
                        targets=[batch.labels for _, batch in trainer.val_batches()])
    if result.val_losses:
        val = result.val_losses[-1][1]
    else:  # the run was already complete: evaluate the checkpoint it resumed from
        print(f"[biglm] {cfg.output_dir} already holds the finished run (step {result.step}); "
              "delete it or pass --out_dir to train again")
        val = trainer.validate()
    print(f"\n[biglm] validation loss {val:.3f} vs unigram baseline {base:.3f} "
          f"({'below' if val < base else 'NOT below'} the baseline)")
    model = trainer.raw_model
    test = hidden_word_test(model, tok, [w for _, w in trainer.val_windows][:8], unigram=logp,
                            doc_ids=trainer._doc_ids, seed=cfg.seed)
    if test.model.ranks:
        m, u = test.model.summary(), test.unigram.summary()
        print(f"[biglm] hidden words in held-out text: {len(test.model.ranks)} tokens of {test.windows} validation "
              f"windows masked ({HIDE_RATE:.0%}), the rest visible; where the gold token ranks:")
        print(f"  {'':<22}{'model':>10}{'unigram':>10}")
        for label, key, fmt in (("ranked first", "first", "{:.1f}%"), ("in the top 5", "top5", "{:.1f}%"),
                                ("median rank", "median_rank", "{:.0f}"), ("mean probability", "mean_prob", "{:.3f}")):
            print(f"  {label:<22}{fmt.format(m[key]):>10}{fmt.format(u[key]):>10}")
        if test.rare_model:
            med_m = float(torch.tensor(test.rare_model, dtype=torch.float64).median())
            med_u = float(torch.tensor(test.rare_unigram, dtype=torch.float64).median())
            print(f"[biglm] where context decides the word ({len(test.rare_model)} hidden tokens that frequency ranks "
                  f"beyond {RARE_RANK}): median rank {med_m:.0f} by the model, {med_u:.0f} by frequency; the model puts "
                  f"{test.rare_found} in its top {TOP}, {test.prose_found} of them words in prose (the rest table cells and "
                  "code)" + (", the first of those, one per word:" if test.examples else ""))
            for line in test.examples:
                print(f"  {line}")
    print("[biglm] fill-ins where the context asks for one word (the model's top 3; the word's rank by the model and "
          "by frequency):")
    fill_ins(model, tok, unigram=logp)
    print(f"\n[biglm] run directory: {cfg.output_dir}; export with `biglm export {cfg.output_dir} OUT_DIR`, "
          f"write with `biglm generate {cfg.output_dir} --prompt ...`")


__all__ = ["DEMO_SENTENCES", "HiddenWordTest", "demo_report", "fill_ins", "hidden_word_test", "is_prose"]
