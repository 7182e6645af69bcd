"""Classification by prompt (paper §4.1 MNLI): the label is a word predicted at an answer slot.

An example becomes ``prompt + <mask>``: under the BiGLM mask the prompt is the prefix and the slot the
suffix, the same shape as generation. Training is cross-entropy over the label words at the slot (the
MLM head restricted to the C label-word ids); prediction is the most probable label word. No new
parameters: the pre-trained MLM head is the classifier, which is why a BiGLM can do this zero-shot too.

Notable features
- Any GLUE/SuperGLUE-style set runs with no code change: data through `datasets` (local file or
  ``hf:OWNER/NAME[:CONFIG][@SPLIT]``) and a template (built-in ``mnli``, a YAML spec, a FLAN pattern).
- Prompts are left-padded so every slot sits in the last column: one ``prefix_len`` and one logits
  position per row, no host sync to find them. Prompts longer than ``max_length`` less the longest label
  word lose their *start* (the question and "Answer:" at the end are what the slot continues), counted
  and reported.
- Label words of any length. When every word is one token: one pass, one slot, cross-entropy over the C
  label-word logits (above). When any word is several tokens (the built-in ``mnli`` words in many BPEs:
  " Neither" is 3 tokens in runs/default's), every class is scored with the chain rule of the
  ``chain`` estimator (`biglm.scoring.estimators.chain_rows`): the word's k slots are the suffix, and
  log p(w) = sum_t log p(w_t | prompt, w_<t, w_>=t masked). Training: the negative chain-rule
  log-likelihood of the gold word (its k rows in one batched forward, full-vocabulary log-softmax, summed
  per example like the one-token loss is per example); prediction: the word with the highest chain-rule
  log-probability (`score_requests`, prefix encoded once per example), or the highest per token with
  ``--task.length_normalize``. A template whose words are all one token keeps the single-pass path and its
  numbers.
- A template that reads the label column is refused before any work (``check_label_free``).
- Data (`load_classification`): checked before any work, errors name the file, the field and the fix
  (missing fields, null texts, labels outside the template's classes); rows labelled -1 (GLUE's unlabelled
  test rows) are dropped and counted (``ClassificationData.dropped_unlabeled``); string labels map through
  ``label_names``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ...data.tables import TaskDataError, load_table, preview
from ...scoring.estimators import chain_rows, score_requests
from ...scoring.metrics import accuracy
from ..task import save_task_export
from ..templates import MNLI_TEMPLATE, PromptTemplate, TemplateError, load_template
from . import TaskRecipe

if TYPE_CHECKING:
    import datasets

log = logging.getLogger(__name__)

BUILTIN_TEMPLATES = {"mnli": MNLI_TEMPLATE}


# ---------------------------------------------------------------- data (GLUE/SuperGLUE style)


@dataclasses.dataclass(frozen=True)
class ClassificationData:
    """A labelled classification split: ``dataset`` has the text fields and an int ``label`` in [0, num_classes)."""

    dataset: datasets.Dataset
    text_fields: tuple[str, ...]
    num_classes: int
    dropped_unlabeled: int
    source: str


def load_classification(
    source: str | os.PathLike[str],
    *,
    split: str = "train",
    template: PromptTemplate | None = None,
    text_fields: Sequence[str] = (),
    label_field: str = "label",
    num_classes: int | None = None,
    label_names: Sequence[str] | None = None,
) -> ClassificationData:
    """Read a classification split whose rows hold text fields and a label, and check it.

    The text fields are ``text_fields`` plus those ``template`` reads; ``num_classes`` defaults to
    the template's label words (or ``label_names``). Labels are ints (or strings listed in
    ``label_names``); -1 rows are dropped and counted. The label column is renamed ``label``.
    """
    if template is not None:
        template.check_label_free(label_field)  # before reading: a prompt holding the answer is never wanted
    ds = load_table(source, split=split)
    src = str(source)
    fields = tuple(dict.fromkeys([*text_fields, *(template.fields if template else ())]))
    if not fields:
        raise TaskDataError(f"{src}: no text fields to read; pass a template or text_fields")
    if template is not None:
        template.check_fields(ds.column_names, source=src)
    missing = [f for f in (*fields, label_field) if f not in ds.column_names]
    if missing:
        raise TaskDataError(f"{src}: rows have no field(s) {missing} (columns: {ds.column_names}); "
                            "pass text_fields=/label_field= naming the right columns")
    feature_names = getattr(ds.features.get(label_field), "names", None)  # a hub ClassLabel
    if label_names is None and feature_names:
        label_names = list(feature_names)
    if num_classes is None:
        num_classes = (template.num_classes if template is not None
                       else len(label_names) if label_names is not None else None)
    if num_classes is None:
        raise TaskDataError(f"{src}: the number of classes is unknown; pass a template, num_classes or label_names")
    if template is not None and template.num_classes != num_classes:
        raise TaskDataError(f"{src}: template {template.name!r} has {template.num_classes} label words but the task "
                            f"has {num_classes} classes; give one label word per class")

    for f in fields:
        nulls = [i for i, v in enumerate(ds[f]) if v is None]
        if nulls:
            raise TaskDataError(f"{src}: field {f!r} is null in {len(nulls)} row(s) (rows {preview(nulls)}); "
                                "fill or drop those rows")

    raw = ds[label_field]
    names = list(label_names) if label_names is not None else None
    labels: list[int] = []
    bad: list[int] = []
    for i, v in enumerate(raw):
        if isinstance(v, bool) or v is None:
            bad.append(i)
        elif isinstance(v, int):
            labels.append(v)
        elif isinstance(v, str) and names is not None and v in names:
            labels.append(names.index(v))
        else:
            bad.append(i)
    if bad:
        example = raw[bad[0]]
        hint = (f"string labels must be one of label_names {names}" if names is not None
                else "pass label_names to map string labels to ids")
        raise TaskDataError(f"{src}: field {label_field!r} holds {len(bad)} value(s) that are not label ids "
                            f"(rows {preview(bad)}, e.g. {example!r}); {hint}")
    out_of_range = sorted({v for v in labels if v != -1 and not 0 <= v < num_classes})
    if out_of_range:
        raise TaskDataError(f"{src}: field {label_field!r} holds label(s) {out_of_range} outside "
                            f"[0, {num_classes}) (and -1 for unlabelled); the template/task has {num_classes} "
                            "classes: fix the label words or the data")

    keep = [i for i, v in enumerate(labels) if v != -1]
    dropped = len(labels) - len(keep)
    if dropped:
        log.warning("%s: dropped %d unlabelled row(s) (label -1) of %d", src, dropped, len(labels))
    if label_field != "label" and "label" in ds.column_names:
        ds = ds.remove_columns("label")
    ds = ds.remove_columns(label_field).add_column("label", labels)
    if dropped:
        ds = ds.select(keep)
    if len(ds) == 0:
        raise TaskDataError(f"{src}: no labelled rows left (all {len(labels)} are -1); use a labelled split")
    return ClassificationData(dataset=ds, text_fields=fields, num_classes=num_classes, dropped_unlabeled=dropped,
                              source=src)


# ---------------------------------------------------------------- the task


@dataclass
class ClassificationSettings:
    """A classification-by-prompt task: data, template, lengths."""

    train: str = ""
    """training split: a local .jsonl/.json/.csv/.parquet file or hf:OWNER/NAME[:CONFIG][@SPLIT]"""
    validation: str = ""
    """validation split (the metric that picks the best epoch), same forms"""
    template: str = "mnli"
    """built-in template name (mnli) or a YAML template spec file"""
    label_field: str = "label"
    """the column holding the class index"""
    max_length: int = 256
    """tokens per example, prompt and label word together"""
    length_normalize: bool = False
    """predict the label word with the highest mean log-probability per token instead of the highest chain-rule
    log-probability (its sum); changes only templates whose label words differ in token length"""
    max_train_examples: int | None = None
    """use only the first N training rows (a quick CPU run)"""
    max_eval_examples: int | None = None
    """use only the first N validation rows"""
    validation_name: str = "validation"
    """how results name the validation split (e.g. MNLI-m)"""
    notes: list[str] = field(default_factory=list)
    """printed with the results (e.g. that a split is not available)"""


class ClassificationTask:
    """`FinetuneTask` for classification by prompt."""

    metric = "accuracy"
    higher_is_better = True

    def __init__(self, settings: ClassificationSettings, *, name: str = "classification") -> None:
        if not settings.train or not settings.validation:
            raise TemplateError(f"task {name}: give --task.train and --task.validation (files or hf: specs)")
        if settings.max_length < 8:
            raise TemplateError(f"--task.max_length {settings.max_length} is too short for a prompt and its slot")
        self.settings, self.name = settings, name
        t = settings.template
        self.template: PromptTemplate = BUILTIN_TEMPLATES[t] if t in BUILTIN_TEMPLATES else load_template(t)
        self.template.check_label_free(settings.label_field)
        self.truncated = 0
        self.eval_split_name = settings.validation_name  # how the loop's epoch lines and metrics.jsonl name it

    # ------------------------------------------------------------------ data
    def prepare(self, tokenizer: Any) -> None:
        s, t = self.settings, self.template
        # any length: words of several tokens are scored with the chain rule (unknown or colliding ones refused)
        self.word_ids: tuple[tuple[int, ...], ...] = dataclasses.replace(t, multi_token=True).label_token_ids(tokenizer)
        self.chain = any(len(w) > 1 for w in self.word_ids)
        self.label_ids = torch.tensor([w[0] for w in self.word_ids])  # (C,), the one-token path's
        longest = max(len(w) for w in self.word_ids)
        if s.max_length - longest < 1:
            raise TemplateError(f"--task.max_length {s.max_length} leaves no room for a prompt before the "
                                f"{longest}-token label word; raise it")
        self.tokenizer = tokenizer
        self.train_data = load_classification(s.train, split="train", template=t, label_field=s.label_field)
        self.val_data = load_classification(s.validation, split="validation", template=t, label_field=s.label_field)
        self._train = self._encode(self.train_data.dataset, s.max_train_examples)
        self._val = self._encode(self.val_data.dataset, s.max_eval_examples)
        if not self._train or not self._val:
            raise TemplateError(f"task {self.name}: {'training' if not self._train else 'validation'} split is empty")

    def _encode(self, dataset, limit: int | None) -> list[dict[str, Any]]:
        rows = dataset if limit is None else dataset.select(range(min(limit, len(dataset))))
        room = self.settings.max_length - max(len(w) for w in self.word_ids)
        rows = list(rows)
        encoded = self.tokenizer([self.template.prompt(row) for row in rows], add_special_tokens=False)["input_ids"]
        out = []
        for row, ids in zip(rows, encoded):  # one batched tokenizer call per split, not one per example
            if len(ids) > room:
                self.truncated += 1
                ids = ids[len(ids) - room:]
            out.append({"prompt_ids": list(ids), "label": int(row["label"])})
        return out

    def train_features(self) -> Sequence[dict[str, Any]]:
        return self._train

    # ------------------------------------------------------------------ model
    def build_model(self, base: torch.nn.Module, tokenizer: Any) -> torch.nn.Module:
        return base  # the MLM head at the slot is the classifier

    def collate(self, features: Sequence[dict[str, Any]], *, device: torch.device) -> dict[str, Any]:
        if self.chain:
            return self._collate_chain(features, device=device)
        pad, mask_id = self.tokenizer.pad_token_id, self.tokenizer.mask_token_id
        L = max(len(f["prompt_ids"]) for f in features) + 1
        ids = torch.full((len(features), L), pad, dtype=torch.long)
        attn = torch.zeros((len(features), L), dtype=torch.long)
        for i, f in enumerate(features):  # left padding: every slot in the last column
            p = f["prompt_ids"]
            ids[i, L - 1 - len(p):L - 1] = torch.tensor(p, dtype=torch.long)
            attn[i, L - 1 - len(p):] = 1
        ids[:, -1] = mask_id
        labels = torch.tensor([f["label"] for f in features], dtype=torch.long)
        return {"input_ids": ids.to(device), "attention_mask": attn.to(device), "labels": labels.to(device),
                "num_items": len(features)}

    def _collate_chain(self, features: Sequence[dict[str, Any]], *, device: torch.device) -> dict[str, Any]:
        """The chain rows of each example's gold word: k rows for a k-token word, the prompt left-padded to the
        batch's longest (the prefix), the word's row right-padded (the suffix), one scored slot per row."""
        pad, mask_id = self.tokenizer.pad_token_id, self.tokenizer.mask_token_id
        P = max(len(f["prompt_ids"]) for f in features)
        rows = [(f["prompt_ids"], tokens, slot, self.word_ids[f["label"]][slot]) for f in features
                for tokens, slot in chain_rows(self.word_ids[f["label"]], mask_id=mask_id)]
        S = max(len(tokens) for _, tokens, _, _ in rows)
        ids = torch.full((len(rows), P + S), pad, dtype=torch.long)
        attn = torch.zeros((len(rows), P + S), dtype=torch.long)
        slots = torch.zeros((len(rows), P + S), dtype=torch.bool)
        for r, (p, tokens, slot, _) in enumerate(rows):
            ids[r, P - len(p):P] = torch.tensor(p, dtype=torch.long)
            ids[r, P:P + len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            attn[r, P - len(p):P + len(tokens)] = 1
            slots[r, P + slot] = True
        targets = torch.tensor([target for *_, target in rows], dtype=torch.long)
        labels = torch.tensor([f["label"] for f in features], dtype=torch.long)
        return {"input_ids": ids.to(device), "attention_mask": attn.to(device), "slots": slots.to(device),
                "targets": targets.to(device), "prefix_len": P, "labels": labels.to(device), "num_items": len(features)}

    def label_scores(self, model: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        """(B, C) logits of the label words at the slot (prompt = prefix, slot = suffix); one-token words only."""
        ids = batch["input_ids"]
        B, L = ids.shape
        slot = torch.arange(B, device=ids.device) * L + (L - 1)  # flat index of each row's slot
        out = model(ids, prefix_len=L - 1, attention_mask=batch["attention_mask"], logits_positions=slot)
        return out.logits.float()[:, self.label_ids.to(ids.device)]

    def loss(self, model: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        if "slots" not in batch:
            return F.cross_entropy(self.label_scores(model, batch), batch["labels"], reduction="sum")
        # chain rule: every row scores one token of its example's gold word, so the sum over rows is the sum
        # over examples of -log p(gold word | prompt)
        logits = model(batch["input_ids"], prefix_len=batch["prefix_len"], attention_mask=batch["attention_mask"],
                       logits_positions=batch["slots"]).logits  # (rows, V): one slot per row, in row order
        return -torch.log_softmax(logits.float(), dim=-1).gather(1, batch["targets"][:, None]).sum()

    @torch.no_grad()
    def word_scores(self, model: torch.nn.Module, features: Sequence[dict[str, Any]], *, batch_size: int) -> np.ndarray:
        """(N, C) chain-rule log-probabilities of every label word after each prompt (per token with
        ``length_normalize``): the prediction is their argmax. Any template; `evaluate` uses it when a word is
        several tokens."""
        requests = [(f["prompt_ids"], w) for f in features for w in self.word_ids]
        scored = score_requests(model, requests, estimator="chain", batch_size=batch_size,
                                row_batch_size=batch_size * sum(len(w) for w in self.word_ids),
                                max_length=self.settings.max_length)
        out = np.array([ll for ll, _ in scored], dtype=np.float64).reshape(len(features), len(self.word_ids))
        if self.settings.length_normalize:
            out /= np.array([len(w) for w in self.word_ids], dtype=np.float64)
        return out

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, *, batch_size: int, device: torch.device) -> dict[str, float]:
        if self.chain:
            s = self.word_scores(model, self._val, batch_size=batch_size)
            y = np.array([f["label"] for f in self._val])
            return {"accuracy": 100.0 * accuracy(s, y), "examples": float(len(y)),
                    "chance": 100.0 * float(np.bincount(y).max() / len(y))}
        scores, labels = [], []
        for i in range(0, len(self._val), batch_size):
            batch = self.collate(self._val[i:i + batch_size], device=device)
            scores.append(self.label_scores(model, batch).cpu())
            labels.append(batch["labels"].cpu())
        s, y = torch.cat(scores).numpy(), torch.cat(labels).numpy()
        return {"accuracy": 100.0 * accuracy(s, y), "examples": float(len(y)),
                "chance": 100.0 * float(np.bincount(y).max() / len(y))}

    # ------------------------------------------------------------------ output
    def export(self, model: torch.nn.Module, tokenizer: Any, out_dir: Path) -> None:
        save_task_export(model, tokenizer, out_dir, record=self.describe())

    def describe(self) -> dict[str, Any]:
        from ...config import to_dict

        return {"task": self.name, "kind": "classification", "settings": to_dict(self.settings),
                "template": self.template.to_dict(), "truncated_prompts": self.truncated}


# ---------------------------------------------------------------- registry (`biglm tasks`)


def _mnli() -> ClassificationSettings:
    return ClassificationSettings(
        train="hf:nyu-mll/glue:mnli@train", validation="hf:nyu-mll/glue:mnli@validation_matched", template="mnli",
        validation_name="MNLI-m",
        notes=["MNLI-mm (validation_mismatched) is not evaluated: give --task.validation to another split file "
               "to add it"])


RECIPES = (
    TaskRecipe("mnli", "MNLI by prompt: label word True/Neither/False at an answer slot; accuracy (MNLI-m)",
               _mnli, lambda s: ClassificationTask(s, name="mnli"), loop={"epochs": 5, "lr": 2e-5}),
    TaskRecipe("classification", "any GLUE/SuperGLUE-style set by prompt: give --task.train, "
               "--task.validation and --task.template", ClassificationSettings,
               lambda s: ClassificationTask(s, name="classification"), loop={"epochs": 5}),
)
