"""CMLM seq2seq fine-tuning (paper §4.1, Table 3 XSUM/MSQG): the tasks `xsum`, `squad-qg`, `seq2seq`.

The source is the BiGLM prefix (never masked); the target is the suffix, with a uniform share of it
masked (β ~ U(0,1), max(1, round(β·n)) of its n tokens, CMLM's rule). The model is
`biglm.model.BiGLMForConditionalGeneration`: the pre-trained masked LM plus a length head over the
mean-pooled prefix states. Loss per example = mean token cross-entropy over its masked target tokens +
``length_loss_weight`` (fairseq's 0.1) × the length cross-entropy; the loop averages it over the examples
of the global batch. (fairseq averages the token term over the batch's masked tokens instead; per example,
short and long targets weigh the same and the loop's normaliser stays a count known before the forward.)
Validation decodes every source with the length head's top-``length_beam`` lengths (3), Mask-Predict with
``decode_steps`` (10) iterations on the exact prefix cache, and keeps the candidate with the best mean
log-probability; the best epoch is chosen by the task metric (ROUGE-L for summaries, BLEU-4 for questions).

Notable features
- Any local or hub data set through `load_table` (``hf:OWNER/NAME[:CONFIG][@SPLIT]``): the source and
  target are templates over its columns (``{document}``, ``{sentence}\\nQuestion:``); a field the data
  lacks is refused, naming the field, the template and the columns. A YAML task file (``kind: seq2seq``)
  takes the same settings.
- Checked before any model work: an empty (or null) source or target is refused naming the row; a source
  longer than ``max_source_length`` keeps its start (XSum's lead carries the summary) and the template's text
  after its last field (the ``\nSummary:`` cue), so a cut source still ends as the template does, with ONE
  warning counting them; a target longer than ``max_target_length`` is refused with the count and the first rows
  (it is never cut: the model would learn to stop mid-sentence) unless ``long_targets: drop``, which drops
  them with a counted message. Validation targets are never cut or dropped (only their text is scored).
- Masks use torch's global RNG, which the loop's checkpoints save and restore, so a killed run resumes
  with the exact masks of the uninterrupted one (tested).
- Metrics from their libraries (`biglm.scoring.metrics`): ROUGE-1/2/L (rouge-score, stemming);
  BLEU-4 (sacrebleu, 13a tokenisation, lower-cased for the lower-cased SQuAD-QG), METEOR (nltk with
  WordNet: checked when the task is built; ``meteor: false`` leaves it out) and ROUGE-L for questions;
  ``meteor`` and ``bleu_lowercase`` are qg's, refused with ``metrics: rouge`` (they would be unused).
  ``length_accuracy`` is the share of sources whose top-1 predicted length equals the target's.
- Export: the seq2seq model (``AutoModelForSeq2SeqLM`` after ``import biglm``), the tokenizer and
  ``biglm_task.json`` with the templates and decoding settings (also in ``config.task_specific_params``).
"""

from __future__ import annotations

import logging
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Sequence

import torch

from ...config import ConfigError, to_dict
from ...data.tables import TaskDataError, load_table
from ...model import BiGLMForMaskedLM
from ...model.seq2seq import BiGLMForConditionalGeneration, length_loss
from ...objective import MaskPattern, apply_masks, masked_lm_loss
from ...scoring import metrics
from ..task import save_task_export
from ..templates import TemplateError
from . import TaskRecipe

log = logging.getLogger(__name__)

__all__ = ["Seq2SeqSettings", "Seq2SeqTask", "decode_with_length_head", "render_rows"]

PARAMS_KEY = "seq2seq"  # config.task_specific_params key: templates and decoding settings of an exported model
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_SHOW = 5


@dataclass
class Seq2SeqSettings:
    """A CMLM seq2seq task: data, templates, lengths, decoding and metrics."""

    train: str = ""
    """training split: a local .jsonl/.json/.csv/.tsv/.parquet file or hf:OWNER/NAME[:CONFIG][@SPLIT]"""
    validation: str = ""
    """validation split (decoded after each epoch; the metric picks the best epoch); empty with
    validation_fraction > 0: held out of the training file"""
    validation_fraction: float = 0.0
    """when > 0 and no validation split is given: hold out this share of the training rows (seeded)"""
    split_seed: int = 0
    """seed of that hold-out"""
    source_template: str = "{source}"
    """the prefix text, with {column} placeholders"""
    target_template: str = "{target}"
    """the target text (the suffix), with {column} placeholders; tokenised after a space"""
    max_source_length: int = 512
    """source tokens kept (longer sources lose their end, with one warning counting them)"""
    max_target_length: int = 64
    """longest target in tokens; also the length head's largest length"""
    long_targets: Literal["refuse", "drop"] = "refuse"
    """training targets longer than max_target_length: refuse the data (default) or drop them with a count"""
    length_loss_weight: float = 0.1
    """weight of the length cross-entropy beside the token loss (fairseq's CMLM: 0.1)"""
    length_beam: int = 3
    """candidate lengths decoded per source at validation (the length head's top-ℓ)"""
    decode_steps: int = 10
    """Mask-Predict iterations T at validation"""
    metrics: Literal["rouge", "qg"] = "rouge"
    """rouge: ROUGE-1/2/L, best epoch by ROUGE-L; qg: BLEU-4, METEOR, ROUGE-L, best epoch by BLEU-4"""
    meteor: bool | None = None
    """qg only: also METEOR (unset: true; needs WordNet, installed by scripts/quickstart.sh)"""
    bleu_lowercase: bool | None = None
    """qg only: BLEU on lower-cased text (unset: false; SQuAD-QG's text is lower-cased already)"""
    max_train_examples: int | None = None
    """use only the first N training rows (a quick CPU run)"""
    max_eval_examples: int | None = None
    """decode only the first N validation rows"""
    validation_name: str = "validation"
    """how results name the validation split"""
    notes: list[str] = field(default_factory=list)
    """printed with the results"""


def _fields(template: str) -> list[str]:
    return list(dict.fromkeys(m.group(1) for m in _PLACEHOLDER.finditer(template)))


def render_rows(rows: Sequence[dict[str, Any]], template: str, *, source: str, what: str) -> list[str]:
    """``template`` filled from each row; a null value is refused naming the row and the column."""
    names = _fields(template)
    out = []
    for i, row in enumerate(rows):
        values = {}
        for name in names:
            value = row.get(name)
            if value is None:
                raise TaskDataError(f"{source}: row {i} has no value for {{{name}}} of the {what} template "
                                    f"{template!r}; fill or drop that row")
            values[name] = str(value)
        out.append(_PLACEHOLDER.sub(lambda m: values[m.group(1)], template))
    return out


def template_tail(template: str) -> str:
    """The template's text after its last field (``"\nSummary:"`` of ``"{document}\nSummary:"``)."""
    return template[list(_PLACEHOLDER.finditer(template))[-1].end():]


def cut_source(ids: Sequence[int], *, max_length: int, tail: Sequence[int]) -> list[int]:
    """A source of more than ``max_length`` tokens cut to its start followed by ``tail`` (the tokens of
    `template_tail`), so the prompt still ends with the template's cue; shorter sources are kept whole."""
    ids = list(ids)
    if len(ids) <= max_length:
        return ids
    return ids[:max_length] if len(tail) >= max_length else ids[:max_length - len(tail)] + list(tail)


def _check_template(template: str, columns: Sequence[str], *, source: str, what: str) -> None:
    names = _fields(template)
    if not names:
        raise TemplateError(f"the {what} template {template!r} names no {{column}}: it would be the same text for "
                            "every row; use e.g. '{document}'")
    missing = [n for n in names if n not in columns]
    if missing:
        raise TemplateError(f"{source}: the {what} template {template!r} names field(s) {missing} that the data "
                            f"lacks (columns: {sorted(columns)}); fix --task.{what}_template")


@torch.no_grad()
def decode_with_length_head(model: BiGLMForConditionalGeneration, prompts: Sequence[Sequence[int]], *,
                            beam: int, steps: int, use_cache: bool = True, batch_size: int = 32,
                            ) -> tuple[list[list[int]], list[int]]:
    """Answers (token ids, cut at the first EOS) for each prompt, and each prompt's top-1 predicted length.

    The length head proposes the ``beam`` most likely lengths of each prompt; Mask-Predict with ``steps``
    iterations decodes all of them side by side on the prompt's exact prefix cache, and the candidate with
    the highest mean log-probability is kept (`biglm.generation.generate_ids` with a (B, beam) length table).
    Prompts go ``batch_size`` at a time, left-padded.
    """
    from ...generation import DecodingConfig, generate_ids, left_pad

    device = next(model.parameters()).device
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    cfg = DecodingConfig(max_new_tokens=int(model.config.max_target_length), steps=steps, use_cache=use_cache,
                         length_beam=beam)
    answers, top1 = [], []
    for i in range(0, len(prompts), batch_size):
        ids, mask = left_pad(prompts[i:i + batch_size], pad_id=pad, device=device)
        lengths = model.predict_lengths(ids, mask, beam=beam)  # (B, beam), most likely first
        top1 += lengths[:, 0].tolist()
        out = generate_ids(model, ids, mask, config=cfg, lengths=lengths)
        answers += out.token_lists()
    return answers, top1


class Seq2SeqTask:
    """`FinetuneTask` for CMLM seq2seq (source = prefix, uniformly masked target = suffix, length head)."""

    higher_is_better = True

    def __init__(self, settings: Seq2SeqSettings, *, name: str = "seq2seq") -> None:
        s = settings
        if not s.train and not getattr(s, "mixture", ""):
            raise ConfigError(f"task {name}: give --task.train (a data file or an hf: spec)")
        if not s.validation and not 0.0 < s.validation_fraction < 1.0:
            raise ConfigError(f"task {name}: give --task.validation, or --task.validation_fraction F in (0, 1) to hold "
                              "out a share of the training rows")
        if s.validation and s.validation_fraction:
            raise ConfigError(f"task {name}: give --task.validation or --task.validation_fraction, not both")
        for key in ("max_source_length", "max_target_length", "length_beam", "decode_steps"):
            if getattr(s, key) < 1:
                raise ConfigError(f"--task.{key} must be at least 1, got {getattr(s, key)}")
        if s.length_beam > s.max_target_length:
            raise ConfigError(f"--task.length_beam {s.length_beam} exceeds --task.max_target_length "
                              f"{s.max_target_length}")
        if s.length_loss_weight < 0:
            raise ConfigError(f"--task.length_loss_weight must be >= 0, got {s.length_loss_weight}")
        for key in ("max_train_examples", "max_eval_examples"):
            if getattr(s, key) is not None and getattr(s, key) < 1:
                raise ConfigError(f"--task.{key} must be at least 1 (or unset), got {getattr(s, key)}")
        if s.metrics == "rouge":  # BLEU and METEOR are qg's: an option for them would be accepted and unused
            for key in ("meteor", "bleu_lowercase"):
                if getattr(s, key) is not None:
                    raise ConfigError(f"task {name}: --task.{key} {str(getattr(s, key)).lower()} applies to "
                                      "--task.metrics qg (BLEU-4, METEOR); --task.metrics rouge scores ROUGE only: "
                                      f"drop --task.{key} or pass --task.metrics qg")
        else:
            s.meteor = True if s.meteor is None else s.meteor
            s.bleu_lowercase = bool(s.bleu_lowercase)
        if s.metrics == "qg" and s.meteor:
            from ...scoring.metrics import load_wordnet

            try:
                load_wordnet()
            except RuntimeError as e:
                raise ConfigError(f"{e}; or pass --task.meteor false to score without METEOR") from None
        self.settings, self.name = s, name
        self.metric = "rougeL" if s.metrics == "rouge" else "bleu4"
        self.eval_split_name = s.validation_name
        self.truncated_sources = 0
        self.dropped_targets = 0

    # ------------------------------------------------------------------ data
    def _read(self, source: str, split: str) -> list[dict[str, Any]]:
        table = load_table(source, split=split)
        for template, what in ((self.settings.source_template, "source"), (self.settings.target_template, "target")):
            _check_template(template, table.column_names, source=source, what=what)
        return list(table)

    def _pairs(self, rows: list[dict[str, Any]], source: str) -> tuple[list[str], list[str]]:
        s = self.settings
        sources = render_rows(rows, s.source_template, source=source, what="source")
        targets = render_rows(rows, s.target_template, source=source, what="target")
        for what, texts in (("target", targets), ("source", sources)):
            empty = [i for i, t in enumerate(texts) if not t.strip()]
            if empty:
                raise TaskDataError(f"{source}: the {what} is empty in {len(empty)} row(s) (row {empty[0]}"
                                    f"{', ...' if len(empty) > 1 else ''}); a seq2seq pair needs a non-empty "
                                    f"{what}: fill or drop those rows")
        return sources, targets

    def prepare(self, tokenizer: Any) -> None:
        s = self.settings
        if tokenizer.mask_token_id is None:
            raise ConfigError("the tokenizer has no mask token: a BiGLM tokenizer is needed (Mask-Predict starts from masks)")
        self.tokenizer = tokenizer
        self.truncated_sources = self.dropped_targets = 0
        self._tail: list[int] | None = None
        train_src = s.train or getattr(s, "mixture", "")  # instruction tuning may render its training mixture
        rows = self._read(train_src, "train")
        if s.validation:
            val_rows = self._read(s.validation, "validation")
            val_src = s.validation
        else:  # held out of the training file, seeded; the order of the rest is kept
            order = list(range(len(rows)))
            random.Random(s.split_seed).shuffle(order)
            n_val = max(1, round(s.validation_fraction * len(rows)))
            held = set(order[:n_val])
            val_rows = [r for i, r in enumerate(rows) if i in held]
            rows = [r for i, r in enumerate(rows) if i not in held]
            val_src = f"{train_src} (held-out {s.validation_fraction:g})"
        if s.max_train_examples is not None:
            rows = rows[:s.max_train_examples]
        if s.max_eval_examples is not None:
            val_rows = val_rows[:s.max_eval_examples]
        if not rows or not val_rows:
            raise TaskDataError(f"task {self.name}: the {'training' if not rows else 'validation'} split is empty")
        self._train = self._encode(*self._pairs(rows, train_src), source=train_src, train=True)
        sources, targets = self._pairs(val_rows, val_src)
        self._val = self._encode(sources, targets, source=val_src, train=False)
        self.val_references = targets
        self.val_sources = sources
        if self.truncated_sources:
            log.warning("%s: %d source(s) longer than max_source_length=%d were cut (%s)", self.name,
                        self.truncated_sources, s.max_source_length, self._cut_rule)
        if not self._train:
            raise TaskDataError(f"{train_src}: no training pair left after dropping long targets")

    def _encode(self, sources: list[str], targets: list[str], *, source: str, train: bool) -> list[dict[str, Any]]:
        s, tok = self.settings, self.tokenizer
        src_ids = tok(sources, add_special_tokens=False)["input_ids"]
        tgt_ids = [self._finish_target(list(t)) for t in
                   tok([" " + t.strip() for t in targets], add_special_tokens=False)["input_ids"]]
        long_rows = [i for i, t in enumerate(tgt_ids) if len(t) > s.max_target_length]
        if train and long_rows:
            if s.long_targets == "refuse":
                raise TaskDataError(
                    f"{source}: {len(long_rows)} of {len(tgt_ids)} target(s) are longer than max_target_length="
                    f"{s.max_target_length} tokens (rows {long_rows[:_SHOW]}{', ...' if len(long_rows) > _SHOW else ''}, "
                    f"longest {max(len(tgt_ids[i]) for i in long_rows)}); targets are never cut: raise "
                    "--task.max_target_length or pass --task.long_targets drop to drop them (counted)")
            log.warning("%s: dropped %d of %d training pair(s) whose target is longer than max_target_length=%d",
                        source, len(long_rows), len(tgt_ids), s.max_target_length)
            self.dropped_targets += len(long_rows)
        skip = set(long_rows) if train else set()
        out = []
        for i, (a, b) in enumerate(zip(src_ids, tgt_ids)):
            if i in skip:
                continue
            if len(a) > s.max_source_length:
                self.truncated_sources += 1
                a = self._cut_source(list(a))
            if not b:
                raise TaskDataError(f"{source}: row {i}'s target tokenises to nothing; give it a non-empty target")
            out.append({"source_ids": list(a), "target_ids": list(b)})
        return out

    _cut_rule = "their start and the template's ending kept"

    def _cut_source(self, ids: list[int]) -> list[int]:
        """A source over max_source_length tokens: its start (a news lead carries the summary), then the tokens of
        the template's text after its last field (e.g. ``\nSummary:``), so the prompt still ends with its cue."""
        if self._tail is None:
            text = template_tail(self.settings.source_template)
            self._tail = list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []
        return cut_source(ids, max_length=self.settings.max_source_length, tail=self._tail)

    def _finish_target(self, ids: list[int]) -> list[int]:
        """The trained suffix of a target's tokens (instruction tuning pads it with EOS here)."""
        return ids

    def train_features(self) -> Sequence[dict[str, Any]]:
        return self._train

    # ------------------------------------------------------------------ model
    def build_model(self, base: torch.nn.Module, tokenizer: Any) -> torch.nn.Module:
        s = self.settings
        room = base.config.max_position_embeddings
        if s.max_source_length + s.max_target_length > room:
            raise ConfigError(f"--task.max_source_length {s.max_source_length} + --task.max_target_length "
                              f"{s.max_target_length} exceed the model's max_position_embeddings={room}: lower them")
        if isinstance(base, BiGLMForConditionalGeneration) and base.config.max_target_length == s.max_target_length:
            return base
        if not isinstance(base, BiGLMForMaskedLM):
            raise TypeError(f"task {self.name}: needs a BiGLMForMaskedLM, got {type(base).__name__}")
        return BiGLMForConditionalGeneration.from_masked_lm(base, max_target_length=s.max_target_length)

    def collate(self, features: Sequence[dict[str, Any]], *, device: torch.device) -> dict[str, Any]:
        """[source | target | pad] rows, a uniform share of each target masked (torch's global RNG)."""
        pad, mask_id = self.tokenizer.pad_token_id, self.tokenizer.mask_token_id
        B = len(features)
        src_len = torch.tensor([len(f["source_ids"]) for f in features])
        tgt_len = torch.tensor([len(f["target_ids"]) for f in features])
        L = int((src_len + tgt_len).max())
        ids = torch.full((B, L), pad, dtype=torch.long)
        attn = torch.zeros((B, L), dtype=torch.long)
        for i, f in enumerate(features):
            row = f["source_ids"] + f["target_ids"]
            ids[i, :len(row)] = torch.tensor(row, dtype=torch.long)
            attn[i, :len(row)] = 1
        # CMLM: β ~ U(0,1), max(1, round(β·n)) target positions chosen uniformly
        beta = torch.rand(B)
        k = torch.floor(beta * tgt_len + 0.5).long().clamp(min=1)
        pos = torch.arange(L)[None, :]
        in_target = (pos >= src_len[:, None]) & (pos < (src_len + tgt_len)[:, None])
        keys = torch.where(in_target, torch.rand(B, L), torch.full((B, L), 2.0))
        rank = keys.argsort(dim=1).argsort(dim=1)
        masked = rank < k[:, None]
        # weight 1/k: the summed loss of a row is its mean token loss
        pattern = MaskPattern(masked=masked, split=src_len, prefix_attention=True,
                              ratios=torch.stack((torch.zeros(B), beta), dim=1), weight=1.0 / k.float())
        mb = apply_masks(ids, pattern, mask_token_id=mask_id, normalizer=torch.ones(()))
        mb.find_positions()
        for name in ("input_ids", "labels", "prefix_len", "split", "loss_weight", "normalizer", "ratios", "positions"):
            setattr(mb, name, getattr(mb, name).to(device))
        return {"masked": mb, "attention_mask": attn.to(device), "target_len": tgt_len.to(device), "num_items": B}

    def loss(self, model: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        mb = batch["masked"]
        out = model(mb.input_ids, prefix_len=mb.prefix_len, attention_mask=batch["attention_mask"],
                    logits_positions=mb.positions, return_length_logits=True)
        tokens = masked_lm_loss(out.logits, mb)  # Σ_rows mean CE of the row's masked target tokens
        return tokens + self.settings.length_loss_weight * length_loss(out.length_logits, batch["target_len"])

    # ------------------------------------------------------------------ evaluation
    def predict(self, model: torch.nn.Module, *, batch_size: int = 32) -> tuple[list[str], list[int]]:
        """Decoded validation targets (text) and the top-1 predicted lengths."""
        s = self.settings
        ids, top1 = decode_with_length_head(model, [f["source_ids"] for f in self._val], beam=s.length_beam,
                                            steps=s.decode_steps, batch_size=batch_size)
        texts = self.tokenizer.batch_decode(ids, skip_special_tokens=True)
        return [t.strip() for t in texts], top1

    def score(self, predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
        s = self.settings
        if s.metrics == "rouge":
            return metrics.rouge(predictions=predictions, references=references)
        out = {"bleu4": metrics.bleu(predictions=predictions, references=references, lowercase=s.bleu_lowercase)}
        if s.meteor:
            out["meteor"] = metrics.meteor(predictions=predictions, references=references)
        out["rougeL"] = metrics.rouge(predictions=predictions, references=references)["rougeL"]
        return out

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, *, batch_size: int, device: torch.device) -> dict[str, float]:
        predictions, top1 = self.predict(model, batch_size=batch_size)
        scores = self.score(predictions, self.val_references)
        true = [len(f["target_ids"]) for f in self._val]
        scores["length_accuracy"] = 100.0 * sum(a == b for a, b in zip(top1, true)) / len(true)
        scores["examples"] = float(len(true))
        return scores

    # ------------------------------------------------------------------ output
    def decoding_params(self) -> dict[str, Any]:
        s = self.settings
        return {"source_template": s.source_template, "target_template": s.target_template,
                "max_source_length": s.max_source_length, "max_new_tokens": s.max_target_length,
                "length_beam": s.length_beam, "steps": s.decode_steps}

    def export(self, model: torch.nn.Module, tokenizer: Any, out_dir: Path) -> None:
        save_task_export(model, tokenizer, out_dir, record=self.describe(), params_key=PARAMS_KEY,
                         params=self.decoding_params())

    def describe(self) -> dict[str, Any]:
        notes = []
        if self.truncated_sources:
            notes.append(f"{self.truncated_sources} source(s) cut to {self.settings.max_source_length} tokens")
        if self.dropped_targets:
            notes.append(f"{self.dropped_targets} training pair(s) dropped: target over "
                         f"{self.settings.max_target_length} tokens")
        return {"task": self.name, "kind": "seq2seq", "settings": to_dict(self.settings),
                "decoding": self.decoding_params(), "truncated_sources": self.truncated_sources,
                "dropped_targets": self.dropped_targets, "notes": notes}


# ---------------------------------------------------------------------- recipes

def _xsum() -> Seq2SeqSettings:
    return Seq2SeqSettings(train="hf:EdinburghNLP/xsum@train", validation="hf:EdinburghNLP/xsum@validation",
                           source_template="{document}\nSummary:", target_template="{summary}",
                           max_source_length=512, max_target_length=128, metrics="rouge")


def _squad_qg() -> Seq2SeqSettings:
    # lmqg/qg_squad is the Du et al. (2017) split (sentence -> question); the shared data holds its dev/test as
    # {src, tgt}: pass --task.source_template '{src}\nQuestion:' --task.target_template '{tgt}' for those files
    return Seq2SeqSettings(train="hf:lmqg/qg_squad@train", validation="hf:lmqg/qg_squad@validation",
                           source_template="{sentence}\nQuestion:", target_template="{question}",
                           max_source_length=256, max_target_length=64, metrics="qg", bleu_lowercase=True)


# paper: 50 epochs for XSUM and MSQG; lr not stated: 5e-5 written down here (5e-5 is also its FLAN lr)
_LOOP = {"epochs": 50, "lr": 5e-5}

RECIPES = (
    TaskRecipe("xsum", "XSum summarisation, CMLM: document = prefix, masked summary = suffix, length head; "
               "ROUGE-1/2/L (best epoch by ROUGE-L)", _xsum, lambda s: Seq2SeqTask(s, name="xsum"), loop=_LOOP),
    TaskRecipe("squad-qg", "SQuAD question generation (Du et al. split, stand-in for MSQG), CMLM; BLEU-4, "
               "METEOR, ROUGE-L (best epoch by BLEU-4)", _squad_qg, lambda s: Seq2SeqTask(s, name="squad-qg"),
               loop=_LOOP),
    TaskRecipe("seq2seq", "any source -> target set, CMLM: give --task.train, --task.validation (or "
               "--task.validation_fraction), --task.source_template, --task.target_template",
               Seq2SeqSettings, lambda s: Seq2SeqTask(s, name="seq2seq"), loop=_LOOP),
)
