"""Instruction tuning on FLAN (paper §4.3, Table 5): the `flan` fine-tuning task (the instruct family, with `flan`).

Instruction tuning is conditional generation on a mixture: the instruction, rendered with the chat
template (`biglm.generation.chat`), is the prefix (never masked); the response is the suffix with a
uniform share masked, the loss on the response only (the CMLM training of `biglm.finetune.tasks.seq2seq`).
Two ways to know where a response ends (``length_mode``):
- ``eos`` (default, LLaDA's SFT practice): each response is padded with EOS to ``max_target_length``
  tokens (at least one EOS) and the EOS slots are trained like any other token, so inference writes
  that many slots and cuts at the first EOS. The model is the plain masked LM: nothing is added.
  Every response is padded to the one length inference writes, not to a multiple of a smaller bucket:
  the slots past a response's padded length are never trained, and decoding a longer answer than
  the model saw for that prompt goes wrong (measured: docs/LOG.md).
- ``head``: the CMLM length head (`BiGLMForConditionalGeneration`), no EOS padding; inference decodes the
  head's top-``length_beam`` lengths. The compared alternative.
Paper settings (the recipe's loop): lr 5e-5, linear decay, 5 epochs, the best epoch on a held-in
validation split (``validation_fraction`` of the training mixture: the same tasks, other rows).

Notable features
- Data: the hub's Flan-collection schema ``{inputs, targets, task_name}`` read as is (local JSONL or
  ``hf:``; a file without inputs/targets is refused naming the file and the field), or a FLAN-style
  mixture rendered from FLAN's templates and local task data (``mixture: FILE.yaml``, see
  `load_mixture_spec`), every evaluation set kept out: a task that reads one is refused naming the set.
- The chat template is applied to every prompt and saved with the exported model as the tokenizer's
  ``chat_template``, so `biglm generate`/`biglm chat` and the server build prompts the same way.
- Validation: exact match and the ``metrics`` of the decoded responses, in either length mode: ROUGE-1/2/L
  (best epoch by ROUGE-L) or ``qg``'s BLEU-4, METEOR (unless ``meteor: false``; WordNet checked when the task
  is built) and ROUGE-L (best epoch by BLEU-4).
- Options the chosen length mode would ignore are refused when the task is built, before any model work:
  ``length_beam`` and ``length_loss_weight`` in eos mode (one trained length is decoded, no length head trained),
  and ``meteor``/``bleu_lowercase`` under ``metrics: rouge`` (no BLEU or METEOR is scored; checked by the seq2seq
  task these settings extend).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

import torch

from ...config import ConfigError, load_yaml
from ...generation.chat import chat_template, render_chat
from ...model.seq2seq import BiGLMForConditionalGeneration
from ...objective import masked_lm_loss
from ..task import TASK_FILE
from ..templates import _default_flan_file
from . import TaskRecipe
from .flan import MixtureTask, mixture_options, read_flan_collection, render_mixture
from .seq2seq import Seq2SeqSettings, Seq2SeqTask, _check_template

__all__ = ["InstructSettings", "InstructTask", "load_mixture_spec", "pad_with_eos"]


@dataclass
class InstructSettings(Seq2SeqSettings):
    """Instruction tuning: Flan rows or a rendered FLAN-style mixture; EOS padding or a length head."""

    train: str = ""
    """Flan-collection rows {inputs, targets, task_name}: a local .jsonl file or hf:OWNER/NAME[:CONFIG][@SPLIT]
    (neither this nor mixture: the shared Flan v2 CoT rows, flan/flan_cot_tiny.jsonl)"""
    mixture: str = ""
    """instead of train: a YAML mixture spec rendered with FLAN's templates (tasks, per_task, exclude_eval...)"""
    validation_fraction: float = 0.05
    """held-in validation: this share of the training rows (same tasks), when no validation file is given"""
    source_template: str = "{inputs}"
    """the instruction text (then rendered as the user turn of the chat template)"""
    target_template: str = "{targets}"
    """the response text"""
    max_target_length: int = 128
    """eos: the answer length, every response padded with EOS to it (at least one EOS) and inference writing that
    many slots (saved as the model's max_new_tokens); head: the length head's largest length"""
    length_mode: Literal["eos", "head"] = "eos"
    """eos: responses padded with EOS to max_target_length, EOS slots trained, fixed-length decoding cut at the
    first EOS; head: the CMLM length head"""
    length_loss_weight: float | None = None
    """head only: weight of the length head's cross-entropy beside the token loss (unset: 0.1, fairseq's CMLM); eos
    mode trains no length head, so it takes none"""
    length_beam: int | None = None
    """head only: candidate lengths decoded per source at validation, the length head's top-ℓ (unset: 3); eos decodes
    the one trained length (max_target_length slots cut at the first EOS), so it takes no length beam"""
    validation_name: str = "held-in"
    """how results name the validation split"""


def pad_with_eos(ids: Sequence[int], *, eos_id: int, length: int) -> list[int]:
    """``ids`` followed by EOS up to ``length`` tokens, and at least one EOS (so longer than ``length`` when
    ``ids`` has ``length`` tokens or more: the task refuses or drops such a response, it never cuts it)."""
    return list(ids) + [eos_id] * max(1, length - len(ids))


def load_mixture_spec(path: str | Path) -> dict[str, Any]:
    """A FLAN-style mixture spec as `render_mixture`'s keywords. YAML::

        templates_file: null          # default: FLAN v2 templates in the shared data
        per_task: 200                 # FLAN's per-task cap (a seeded sample)
        options_style: flan2021       # or flan_v2
        exclude_eval: null            # default: $BIGLM_EVAL_DATA or the shared eval folder (none found: refused);
                                      # or a list of files/folders/names/hf: specs; [] turns the check off
        seed: 0
        tasks:
          - {name: anli_r1, source: anli_train.jsonl, label_words: [yes, it is not possible to tell, no]}

    Relative paths are relative to the spec file.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--task.mixture {path}: no such file; give a FLAN-style mixture spec (YAML, see "
                          "docs/examples/flan_demo_mix.yaml)")
    data = load_yaml(path) or {}
    if not isinstance(data, dict) or not isinstance(data.get("tasks"), list) or not data["tasks"]:
        raise ConfigError(f"{path}: a mixture spec needs `tasks:`, a list of {{name, source, ...}} (see "
                          "biglm.finetune.tasks.instruct.load_mixture_spec)")
    unknown = sorted(set(data) - {"tasks", "templates_file", "per_task", "options_style", "exclude_eval", "seed"})
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {unknown}; allowed: tasks, templates_file, per_task, options_style, "
                          "exclude_eval, seed")

    def local(value: str) -> str:
        return value if value.startswith("hf:") or Path(value).is_absolute() else str(path.parent / value)

    fields = set(MixtureTask.__dataclass_fields__)
    tasks = []
    for i, t in enumerate(data["tasks"]):
        if not isinstance(t, dict) or "name" not in t or "source" not in t:
            raise ConfigError(f"{path}: tasks[{i}] needs `name` and `source`")
        bad = sorted(set(t) - fields)
        if bad:
            raise ConfigError(f"{path}: tasks[{i}] has unknown key(s) {bad}; allowed: {sorted(fields)}")
        tasks.append(MixtureTask(**{**t, "source": local(str(t["source"]))}))
    out: dict[str, Any] = {"tasks": tasks, **mixture_options(data, where=str(path))}  # typed: one line if wrong
    if data.get("templates_file"):
        out["templates_file"] = local(str(data["templates_file"]))
    if data.get("exclude_eval") is not None:
        ex = data["exclude_eval"]
        out["exclude_eval"] = [local(str(e)) if ("/" in str(e) or str(e).startswith("hf:")) else str(e)
                               for e in ([ex] if isinstance(ex, str) else ex)]
    return out


class InstructTask(Seq2SeqTask):
    """`FinetuneTask` for instruction tuning (chat-templated instruction = prefix, response = masked suffix)."""

    def __init__(self, settings: InstructSettings, *, name: str = "flan") -> None:
        s = settings
        if not s.train and not s.mixture and name == "flan" and _shared_flan_rows().is_file():
            s.train = str(_shared_flan_rows())  # the recipe's default data
        if bool(s.train) == bool(s.mixture):
            raise ConfigError(f"task {name}: give exactly one of --task.train (Flan-collection rows) and --task.mixture "
                              "(a FLAN-style mixture spec)")
        if s.length_mode == "eos":
            if s.length_beam not in (None, 1):
                raise ConfigError(f"task {name}: --task.length_beam {s.length_beam} needs --task.length_mode head (the "
                                  "length head's top lengths); eos mode decodes max_target_length slots cut at the "
                                  "first EOS: drop --task.length_beam or pass --task.length_mode head")
            s.length_beam = 1  # what eos decoding does (and saves with the model)
            if s.length_loss_weight not in (None, 0):
                raise ConfigError(f"task {name}: --task.length_loss_weight {s.length_loss_weight} needs "
                                  "--task.length_mode head (it weighs the length head's loss); eos mode trains no "
                                  "length head: drop --task.length_loss_weight or pass --task.length_mode head")
            s.length_loss_weight = 0.0  # what eos mode trains with
        else:
            s.length_beam = 3 if s.length_beam is None else s.length_beam
            s.length_loss_weight = 0.1 if s.length_loss_weight is None else s.length_loss_weight
        if s.mixture:
            self._mixture = load_mixture_spec(s.mixture)  # a bad spec fails before any model work
        super().__init__(s, name=name)  # (checks the metrics: qg with METEOR needs WordNet, checked here)

    # ------------------------------------------------------------------ data
    def _read(self, source: str, split: str) -> list[dict[str, Any]]:
        s = self.settings
        if split == "train" and s.mixture:
            table = render_mixture(**self._mixture)  # refuses any evaluation set, naming it
        else:
            table = read_flan_collection(source, split=split).dataset  # refuses a file without inputs/targets
        for template, what in ((s.source_template, "source"), (s.target_template, "target")):
            _check_template(template, table.column_names, source=source, what=what)
        return list(table)

    def _pairs(self, rows: list[dict[str, Any]], source: str) -> tuple[list[str], list[str]]:
        sources, targets = super()._pairs(rows, source)
        return [render_chat(self.tokenizer, [{"role": "user", "content": x}]) for x in sources], targets

    _cut_rule = "their end kept: the question and the chat template's answer cue"

    def _cut_source(self, ids: list[int]) -> list[int]:
        """A chat-templated instruction over max_source_length tokens keeps its end (the template's answer cue and,
        in FLAN, the question), as `biglm generate`, `biglm chat` and the server cut a long prompt."""
        return ids[len(ids) - self.settings.max_source_length:]

    def _finish_target(self, ids: list[int]) -> list[int]:
        if self.settings.length_mode == "head":
            return ids
        return pad_with_eos(ids, eos_id=self.tokenizer.eos_token_id, length=self.settings.max_target_length)

    def prepare(self, tokenizer: Any) -> None:
        if self.settings.length_mode == "eos" and tokenizer.eos_token_id is None:
            raise ConfigError("length_mode eos needs a tokenizer with an EOS token; use --task.length_mode head")
        super().prepare(tokenizer)

    # ------------------------------------------------------------------ model
    def build_model(self, base: torch.nn.Module, tokenizer: Any) -> torch.nn.Module:
        if self.settings.length_mode == "head":
            return super().build_model(base, tokenizer)
        s = self.settings
        room = base.config.max_position_embeddings
        if s.max_source_length + s.max_target_length > room:
            raise ConfigError(f"--task.max_source_length {s.max_source_length} + --task.max_target_length "
                              f"{s.max_target_length} exceed the model's max_position_embeddings={room}: lower them")
        if isinstance(base, BiGLMForConditionalGeneration):  # a seq2seq start: its length head would pick lengths
            return base.to_masked_lm()
        return base  # EOS padding: the masked LM itself, nothing new

    def loss(self, model: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        if self.settings.length_mode == "head":
            return super().loss(model, batch)
        mb = batch["masked"]
        out = model(mb.input_ids, prefix_len=mb.prefix_len, attention_mask=batch["attention_mask"],
                    logits_positions=mb.positions)
        return masked_lm_loss(out.logits, mb)

    # ------------------------------------------------------------------ evaluation
    def predict(self, model: torch.nn.Module, *, batch_size: int = 32) -> tuple[list[str], list[int]]:
        if self.settings.length_mode == "head":
            return super().predict(model, batch_size=batch_size)
        from ...generation import DecodingConfig, generate_ids, left_pad

        device = next(model.parameters()).device
        cfg = DecodingConfig(max_new_tokens=self.settings.max_target_length, steps=self.settings.decode_steps,
                             length_head=False)  # the trained length, never a head's
        prompts = [f["source_ids"] for f in self._val]
        texts = []
        for i in range(0, len(prompts), batch_size):  # one fixed length for all: prompts batch with left padding
            ids, mask = left_pad(prompts[i:i + batch_size], pad_id=self.tokenizer.pad_token_id, device=device)
            out = generate_ids(model, ids, mask, config=cfg)
            texts += self.tokenizer.batch_decode(out.token_lists(), skip_special_tokens=True)
        return [t.strip() for t in texts], []

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, *, batch_size: int, device: torch.device) -> dict[str, float]:
        predictions, top1 = self.predict(model, batch_size=batch_size)
        refs = [t.strip() for t in self.val_references]
        scores = self.score(predictions, refs)  # --task.metrics, in either length mode (it names the best-epoch metric)
        scores["exact_match"] = 100.0 * sum(p == r for p, r in zip(predictions, refs)) / len(refs)
        if top1:
            true = [len(f["target_ids"]) for f in self._val]
            scores["length_accuracy"] = 100.0 * sum(a == b for a, b in zip(top1, true)) / len(true)
        scores["examples"] = float(len(refs))
        return scores

    # ------------------------------------------------------------------ output
    def decoding_params(self) -> dict[str, Any]:
        params = super().decoding_params()
        params.update(length_mode=self.settings.length_mode, chat_template=True)
        if self.settings.length_mode == "eos":
            params.update(max_new_tokens=self.settings.max_target_length, length_beam=1)
        return params

    def export(self, model: torch.nn.Module, tokenizer: Any, out_dir: Path) -> None:
        tokenizer.chat_template = chat_template(tokenizer)  # saved with the model: generate/chat/serve use it
        super().export(model, tokenizer, out_dir)
        info = json.loads((Path(out_dir) / TASK_FILE).read_text())
        info["kind"] = "instruct"
        (Path(out_dir) / TASK_FILE).write_text(json.dumps(info, indent=2))

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["kind"] = "instruct"
        return out


def _shared_flan_rows() -> Path:
    return _default_flan_file().parent / "flan_cot_tiny.jsonl"


def _flan() -> InstructSettings:
    # no data named: the shared Flan v2 CoT rows (Flan-collection schema); the hub's full collection is
    # --task.train hf:OWNER/NAME (e.g. a Flan-collection export), or --task.mixture renders one locally
    return InstructSettings(max_target_length=192)


RECIPES = (
    TaskRecipe("flan", "instruction tuning on FLAN (Flan-collection rows or a rendered FLAN-style mixture): "
               "chat-templated instruction = prefix, response = masked suffix padded with EOS (or a length head); "
               "ROUGE-L on a held-in split", _flan, lambda s: InstructTask(s, name="flan"),
               loop={"epochs": 5, "lr": 5e-5, "schedule": "linear"}),
)
