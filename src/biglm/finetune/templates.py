"""Prompt templates for classification by prompt: text with ``{field}`` slots and label words.

An example becomes a prompt with one answer slot at its end, e.g. the built-in MNLI template
``{premise} Question: {hypothesis} True, False or Neither? Answer: {answer}``; under the BiGLM
mask the prompt is the prefix and the slot the suffix. Each class has a label word, predicted
at the slot.

Notable features
- One slot, ``{answer}``, and it must end the template (only whitespace may follow): the slot is
  the suffix, and a suffix holding more text would no longer be "the label word".
- Slot spacing follows byte-level BPE: a space right before ``{answer}`` moves into the label
  word, so the target is " True" (one token ``ĠTrue``, as pre-training saw it after "Answer:")
  and the prompt ends in "Answer:".
- ``{options_}`` (FLAN) renders the label words as FLAN 2021 does: ``OPTIONS:\\n- w1\\n- w2...``;
  FLAN v2 samples among several option headers, here the header is fixed (``options_header``).
- Checked before any work: every field the template names exists in the data
  (``check_fields``), none is the label column (``check_label_free``: the prompt would hold the
  answer), and with a tokenizer (``label_token_ids``) every label word is one token,
  not ``<unk>``, and no two classes share a first token. Multi-token label words pass only with
  ``multi_token=True`` (scored with the chain rule); they may share a first token but not
  their whole token sequence. Fine-tuning (``classification``) takes label words of any length.
- Sources: the built-in ``MNLI_TEMPLATE``, a YAML spec (``load_template``), a FLAN v2 pattern
  (``flan_template``, from ``templates_flan_v2.json``) and a promptsource template
  (``promptsource_template``) when its Jinja is plain substitution; one with Jinja logic
  (if/for/filters) is refused with the fix.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import yaml

__all__ = [
    "ANSWER_SLOT", "MNLI_TEMPLATE", "OPTIONS_SLOT", "PromptTemplate", "TemplateError", "flan_template",
    "load_template", "promptsource_template",
]

ANSWER_SLOT = "answer"
OPTIONS_SLOT = "options_"  # FLAN's name for the rendered list of label words
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


class TemplateError(ValueError):
    """A template, template spec or label word that cannot be used; the message names the fix."""


class _Tokenizer(Protocol):  # the part of a transformers tokenizer the checks use
    unk_token_id: int | None

    def __call__(self, text: str, *, add_special_tokens: bool = ...) -> Any: ...

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]: ...


@dataclasses.dataclass(frozen=True)
class PromptTemplate:
    """A prompt with ``{field}`` placeholders ending in the ``{answer}`` slot, and one label word per class."""

    template: str
    """Prompt text; ``{name}`` is a data field, ``{options_}`` the rendered label words, ``{answer}`` the slot."""
    label_words: tuple[str, ...]
    """Label word of class i at index i (the dataset's label ids), e.g. ("True", "Neither", "False")."""
    name: str = "template"
    """Shown in error messages and saved with a fine-tuned model."""
    label_names: tuple[str, ...] | None = None
    """Optional class names for reports, e.g. ("entailment", "neutral", "contradiction")."""
    multi_token: bool = False
    """Allow label words of several tokens (scored with the chain rule)."""
    options_header: str = "OPTIONS:"
    """First line of the ``{options_}`` rendering."""
    source: str = "<python>"
    """Where the template came from (a file path), for error messages."""

    def __post_init__(self) -> None:
        where = f"{self.source}: template {self.name!r}"
        if isinstance(self.label_words, (str, bytes)) or not isinstance(self.label_words, Sequence):
            raise TemplateError(f"{where}: label_words must be a list of strings, one per class")
        object.__setattr__(self, "label_words", tuple(self.label_words))
        if len(self.label_words) < 2:
            raise TemplateError(f"{where}: needs at least 2 label words (one per class), got {list(self.label_words)}")
        for i, word in enumerate(self.label_words):
            if not isinstance(word, str):
                raise TemplateError(f"{where}: label word {i} is {word!r} ({type(word).__name__}), not a string; "
                                    "quote it in YAML (\"True\", \"yes\" and \"no\" otherwise parse as booleans)")
            if not word.strip():
                raise TemplateError(f"{where}: label word {i} is empty; give every class a word")
        dupes = sorted({w for w in self.label_words if self.label_words.count(w) > 1})
        if dupes:
            raise TemplateError(f"{where}: label words {dupes} stand for more than one class; give each class its own word")
        if self.label_names is not None:
            object.__setattr__(self, "label_names", tuple(self.label_names))
            if len(self.label_names) != len(self.label_words):
                raise TemplateError(f"{where}: {len(self.label_names)} label_names for {len(self.label_words)} "
                                    "label words; give one name per class or none")
        slots = [m for m in _PLACEHOLDER.finditer(self.template) if m.group(1) == ANSWER_SLOT]
        if len(slots) != 1:
            raise TemplateError(f"{where}: the template must hold the answer slot {{{ANSWER_SLOT}}} exactly once "
                                f"(found {len(slots)}); end it with e.g. 'Answer: {{{ANSWER_SLOT}}}'")
        if self.template[slots[0].end():].strip():
            raise TemplateError(f"{where}: text follows {{{ANSWER_SLOT}}} ({self.template[slots[0].end():]!r}); "
                                "the slot is the suffix under the BiGLM mask and must end the template: "
                                "move that text before the slot")

    # ---- structure

    @property
    def fields(self) -> tuple[str, ...]:
        """The data fields the template reads, in order of first use."""
        names = [m.group(1) for m in _PLACEHOLDER.finditer(self.template)]
        return tuple(dict.fromkeys(n for n in names if n not in (ANSWER_SLOT, OPTIONS_SLOT)))

    @property
    def num_classes(self) -> int:
        return len(self.label_words)

    @property
    def _prompt_part(self) -> str:
        return self.template[: self.template.index("{" + ANSWER_SLOT + "}")]

    @property
    def targets(self) -> tuple[str, ...]:
        """The label words as they follow the prompt: with a leading space when the slot has one before it."""
        lead = " " if self._prompt_part.endswith(" ") else ""
        return tuple(lead + w for w in self.label_words)

    def check_fields(self, columns: Iterable[str], *, source: str = "the data") -> None:
        """Refuse a template naming a field that ``columns`` (the dataset's) lack."""
        have = set(columns)
        missing = [f for f in self.fields if f not in have]
        if missing:
            raise TemplateError(
                f"{source}: template {self.name!r} ({self.source}) names field(s) {missing} that the data lacks "
                f"(columns: {sorted(have)}); rename the template's placeholders or pass field_map "
                f"(template field -> data column)")

    def check_label_free(self, label_field: str = "label") -> None:
        """Refuse a template that reads the label column (``label_field``, or ``label``, which the data readers
        give the class ids): its prompt would hold the answer it asks for."""
        leaks = [f for f in self.fields if f in (label_field, "label")]
        if leaks:
            raise TemplateError(f"{self.source}: template {self.name!r} names the label field {{{leaks[0]}}}: the prompt "
                                "would give the answer away; remove it from the template")

    # ---- rendering

    def options_text(self) -> str:
        """FLAN's ``{options_}`` rendering of the label words."""
        return "\n- ".join([self.options_header, *self.label_words])

    def prompt(self, example: Mapping[str, Any]) -> str:
        """The prompt text of ``example``: the template up to the slot, trailing spaces left to the target."""
        def fill(m: re.Match[str]) -> str:
            name = m.group(1)
            if name == OPTIONS_SLOT:
                return self.options_text()
            if name not in example:
                raise TemplateError(f"template {self.name!r}: the example has no field {name!r} "
                                    f"(fields: {sorted(example)})")
            value = example[name]
            if value is None:
                raise TemplateError(f"template {self.name!r}: field {name!r} is null in this example")
            return str(value)

        return _PLACEHOLDER.sub(fill, self._prompt_part.rstrip(" "))

    def render(self, example: Mapping[str, Any], label: int) -> tuple[str, str]:
        """(prompt text, target) for class ``label``; prompt + target is the full text."""
        if not 0 <= label < self.num_classes:
            raise TemplateError(f"template {self.name!r}: label {label} is outside [0, {self.num_classes})")
        return self.prompt(example), self.targets[label]

    # ---- tokenizer checks

    def label_token_ids(self, tokenizer: _Tokenizer) -> tuple[tuple[int, ...], ...]:
        """The token ids of each class's target, checked against ``tokenizer`` (see the module docstring)."""
        where = f"{self.source}: template {self.name!r}"
        ids: list[tuple[int, ...]] = []
        for word, target in zip(self.label_words, self.targets):
            tok_ids = tuple(int(i) for i in tokenizer(target, add_special_tokens=False)["input_ids"])
            pieces = tokenizer.convert_ids_to_tokens(list(tok_ids))
            if not tok_ids:
                raise TemplateError(f"{where}: label word {word!r} encodes to no token")
            unk = tokenizer.unk_token_id
            if unk is not None and unk in tok_ids:
                raise TemplateError(f"{where}: label word {word!r} is not in the tokenizer's vocabulary "
                                    f"(encodes to {pieces}, with <unk>); choose a word the vocabulary holds")
            if len(tok_ids) > 1 and not self.multi_token:
                raise TemplateError(f"{where}: label word {word!r} is {len(tok_ids)} tokens {pieces} in this "
                                    "tokenizer; choose a one-token word or set multi_token: true "
                                    "(scored with the chain rule)")
            ids.append(tok_ids)
        for i in range(len(ids)):
            for j in range(i + 1, len(ids)):
                a, b = self.label_words[i], self.label_words[j]
                # single-token words: equal ids = a collision; multi-token words may share a first
                # token (the chain rule scores the rest) but not the whole sequence
                if ids[i] == ids[j]:
                    raise TemplateError(f"{where}: label words {a!r} and {b!r} encode to the same token(s) "
                                        f"{list(ids[i])}; choose words the tokenizer tells apart")
        return tuple(ids)

    def with_field_map(self, field_map: Mapping[str, str]) -> PromptTemplate:
        """A copy whose placeholders are renamed (template field -> data column), e.g. FLAN's {text} -> {passage}."""
        bad = [k for k in field_map if k in (ANSWER_SLOT, OPTIONS_SLOT) or field_map[k] in (ANSWER_SLOT, OPTIONS_SLOT)]
        if bad:
            raise TemplateError(f"{self.source}: field_map may not rename the reserved slots {bad}")

        def rename(m: re.Match[str]) -> str:
            return "{" + field_map.get(m.group(1), m.group(1)) + "}"

        return dataclasses.replace(self, template=_PLACEHOLDER.sub(rename, self.template))

    def to_dict(self) -> dict[str, Any]:
        """The YAML/JSON spec of this template (what ``load_template`` reads back)."""
        spec: dict[str, Any] = {"name": self.name, "template": self.template, "label_words": list(self.label_words),
                                "multi_token": self.multi_token}
        if self.label_names is not None:
            spec["label_names"] = list(self.label_names)
        if self.options_header != "OPTIONS:":
            spec["options_header"] = self.options_header
        return spec


MNLI_TEMPLATE = PromptTemplate(
    name="mnli",
    template="{premise} Question: {hypothesis} True, False or Neither? Answer: {answer}",
    label_words=("True", "Neither", "False"),  # GLUE ids: 0 entailment, 1 neutral, 2 contradiction
    label_names=("entailment", "neutral", "contradiction"),
    source="biglm.finetune.templates",
)


# ---------------------------------------------------------------- YAML spec

_SPEC_KEYS = {"name", "template", "flan", "promptsource", "label_words", "label_names", "multi_token",
              "options_header", "field_map"}


def read_template_file(path: Path, parse: Callable[[str], Any], *, missing: str, language: str,
                       parse_error: type[Exception]) -> Any:
    """``parse`` of ``path``'s text; a missing file or text ``parse`` refuses (``parse_error``) is a `TemplateError`
    naming the file: ``"<path>: <missing>"`` or ``"<path>: not valid <language> (<parser's message>)"``."""
    try:
        return parse(path.read_text())
    except FileNotFoundError as e:
        raise TemplateError(f"{path}: {missing}") from e
    except parse_error as e:
        raise TemplateError(f"{path}: not valid {language} ({e})") from e


def load_template(path: str | os.PathLike[str]) -> PromptTemplate:
    """Read a template spec (YAML) and check it. One of three sources, with the same other keys:

    .. code-block:: yaml

        name: mnli
        template: "{premise} Question: {hypothesis} True, False or Neither? Answer: {answer}"
        label_words: ["True", "Neither", "False"]      # index = label id; or a mapping {0: "True", ...}
        label_names: [entailment, neutral, contradiction]   # optional
        multi_token: false                             # optional
        field_map: {text: passage}                     # optional, template field -> data column
        # instead of `template`:
        # flan: {task: mnli, index: 0, file: PATH/templates_flan_v2.json, sep: " "}
        # promptsource: {file: PATH/glue/mnli/templates.yaml, name: "GPT-3 style"}

    A FLAN spec needs ``label_words``; a promptsource template brings its own (``answer_choices``)
    unless ``label_words`` overrides them. Relative files resolve against the spec's folder.
    """
    p = Path(path)
    spec = read_template_file(p, yaml.safe_load, missing="no such template spec file", language="YAML",
                              parse_error=yaml.YAMLError)
    if not isinstance(spec, dict):
        raise TemplateError(f"{p}: a template spec is a YAML mapping with keys template/flan/promptsource, "
                            "label_words, ...")
    unknown = sorted(set(spec) - _SPEC_KEYS)
    if unknown:
        raise TemplateError(f"{p}: unknown key(s) {unknown}; allowed: {sorted(_SPEC_KEYS)}")
    sources = [k for k in ("template", "flan", "promptsource") if k in spec]
    if len(sources) != 1:
        raise TemplateError(f"{p}: give exactly one of template / flan / promptsource (found {sources or 'none'})")
    label_words = _label_words_from_spec(spec.get("label_words"), source=str(p))
    common: dict[str, Any] = {"multi_token": bool(spec.get("multi_token", False))}
    if "options_header" in spec:
        common["options_header"] = str(spec["options_header"])
    kind = sources[0]
    if kind == "template":
        if label_words is None:
            raise TemplateError(f"{p}: label_words is missing; list one word per class (index = label id)")
        tmpl = PromptTemplate(template=str(spec["template"]), label_words=label_words,
                              name=str(spec.get("name", p.stem)), source=str(p), **common)
    elif kind == "flan":
        f = _mapping(spec["flan"], "flan", p)
        if label_words is None:
            raise TemplateError(f"{p}: a FLAN template needs label_words (FLAN's option strings, one per class)")
        if "task" not in f or "index" not in f:
            raise TemplateError(f"{p}: flan needs task and index, e.g. flan: {{task: mnli, index: 0}}")
        tmpl = flan_template(str(f["task"]), int(f["index"]), label_words=label_words,
                             path=_resolve(f.get("file"), p), sep=str(f.get("sep", " ")), **common)
    else:
        f = _mapping(spec["promptsource"], "promptsource", p)
        if "file" not in f or "name" not in f:
            raise TemplateError(f"{p}: promptsource needs file and name, e.g. "
                                "promptsource: {file: glue/mnli/templates.yaml, name: GPT-3 style}")
        tmpl = promptsource_template(_resolve(f["file"], p), str(f["name"]), **common)
        if label_words is not None:
            tmpl = dataclasses.replace(tmpl, label_words=label_words)
    if "name" in spec:
        tmpl = dataclasses.replace(tmpl, name=str(spec["name"]))
    if spec.get("label_names") is not None:
        tmpl = dataclasses.replace(tmpl, label_names=tuple(str(n) for n in spec["label_names"]))
    if spec.get("field_map"):
        tmpl = tmpl.with_field_map({str(k): str(v) for k, v in _mapping(spec["field_map"], "field_map", p).items()})
    return tmpl


def _mapping(value: Any, key: str, path: Path) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TemplateError(f"{path}: {key} must be a mapping, got {value!r}")
    return value


def _resolve(file: Any, spec_path: Path) -> Path | None:
    if file is None:
        return None
    f = Path(str(file))
    return f if f.is_absolute() else spec_path.parent / f


def _label_words_from_spec(value: Any, *, source: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, dict):  # {0: "True", 1: "Neither", ...}
        try:
            keyed = {int(k): v for k, v in value.items()}
        except (TypeError, ValueError) as e:
            raise TemplateError(f"{source}: label_words keys must be label ids 0..n-1, got {list(value)}") from e
        if sorted(keyed) != list(range(len(keyed))):
            raise TemplateError(f"{source}: label_words keys must be 0..{len(keyed) - 1}, got {sorted(keyed)}")
        value = [keyed[i] for i in range(len(keyed))]
    if not isinstance(value, list):
        raise TemplateError(f"{source}: label_words must be a list (index = label id) or a mapping id -> word")
    return tuple(value)  # types are checked by PromptTemplate, which names a YAML boolean


# ---------------------------------------------------------------- FLAN v2

def _default_flan_file() -> Path:
    env = os.environ.get("BIGLM_FLAN_TEMPLATES")
    if env:
        return Path(env)
    # the shared data folder sits beside the repository (../shared/data)
    return Path(__file__).resolve().parents[4] / "shared" / "data" / "finetune" / "flan" / "templates_flan_v2.json"


def flan_template(
    task: str,
    index: int,
    *,
    label_words: Sequence[str],
    path: str | os.PathLike[str] | None = None,
    sep: str = " ",
    multi_token: bool = False,
    options_header: str = "OPTIONS:",
) -> PromptTemplate:
    """The FLAN v2 pattern ``index`` of ``task`` as a prompt template: ``input + sep + {answer}``.

    ``path`` is ``templates_flan_v2.json`` (``{"patterns": {task: [[input, target], ...]}, "aliases": ...}``);
    by default ``$BIGLM_FLAN_TEMPLATES`` or ``../shared/data/finetune/flan/``. Only patterns whose
    target is exactly ``{answer}`` are classification prompts; FLAN's MNLI options are
    ("yes", "it is not possible to tell", "no"), so pass ``multi_token=True`` for them.
    """
    file = Path(path) if path is not None else _default_flan_file()
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError as e:
        raise TemplateError(f"{file}: FLAN template file not found; pass path= (templates_flan_v2.json)") from e
    patterns = data.get("patterns", {}) if isinstance(data, dict) else {}
    aliases = data.get("aliases", {}) if isinstance(data, dict) else {}
    key = aliases.get(task, task)
    if key not in patterns:
        near = sorted(k for k in patterns if task.lower() in k.lower())[:10]
        raise TemplateError(f"{file}: no FLAN task {task!r}; similar: {near or sorted(patterns)[:10]}")
    pairs = patterns[key]
    if not 0 <= index < len(pairs):
        raise TemplateError(f"{file}: task {task!r} has patterns 0..{len(pairs) - 1}, not {index}")
    inp, target = pairs[index]
    if target.strip() != "{" + ANSWER_SLOT + "}":
        raise TemplateError(f"{file}: pattern {index} of {task!r} has target {target!r}, not {{answer}}: it is a "
                            "generation pattern, not a classification prompt; pick another index")
    return PromptTemplate(template=inp + sep + "{" + ANSWER_SLOT + "}", label_words=tuple(label_words),
                          name=f"flan:{task}:{index}", multi_token=multi_token, options_header=options_header,
                          source=str(file))


# ---------------------------------------------------------------- promptsource

_JINJA_VAR = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_JINJA_LITERAL = re.compile(r"""\{\{\s*(?:"([^"{}]*)"|'([^'{}]*)')\s*\}\}""")
_CHOICE = r"\{\{\s*answer_choices\s*\[\s*label\s*\]\s*\}\}"
# the target: the label's answer choice, bare or inside SuperGLUE's guard for unlabelled rows
_JINJA_TARGET = re.compile(rf"^\s*(?:{_CHOICE}|\{{%\s*if\s+label\s*!=\s*-1\s*%\}}\s*{_CHOICE}\s*\{{%\s*endif\s*%\}})\s*$")


class _PromptsourceLoader(yaml.SafeLoader):
    """Reads promptsource's templates.yaml, whose !Template/!TemplateMetadata tags become plain mappings."""


def _as_mapping(loader: yaml.SafeLoader, node: yaml.Node) -> dict[str, Any]:
    return loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]


_PromptsourceLoader.add_constructor("!Template", _as_mapping)
_PromptsourceLoader.add_constructor("!TemplateMetadata", _as_mapping)


def promptsource_template(
    path: str | os.PathLike[str],
    name: str,
    *,
    multi_token: bool = False,
    options_header: str = "OPTIONS:",
) -> PromptTemplate:
    """The promptsource template ``name`` of a ``templates.yaml`` as a prompt template.

    Supported: Jinja that only substitutes fields (``{{premise}}``) and string literals
    (``{{"always"}}``), with target ``{{ answer_choices[label] }}`` (bare, or inside
    ``{% if label != -1 %}...{% endif %}`` as SuperGLUE's templates write it); ``answer_choices``
    (``A ||| B ||| C``) become the label words. Anything else (if/for, filters, indexing) is
    refused: render it with promptsource itself, or rewrite it as a biglm template.
    """
    file = Path(path)
    try:
        data = yaml.load(file.read_text(), Loader=_PromptsourceLoader)  # noqa: S506 - SafeLoader subclass
    except FileNotFoundError as e:
        raise TemplateError(f"{file}: no such promptsource templates.yaml") from e
    templates = (data or {}).get("templates") or {}
    by_name = {t.get("name"): t for t in templates.values() if isinstance(t, dict)}
    if name not in by_name:
        raise TemplateError(f"{file}: no template named {name!r}; names: {sorted(n for n in by_name if n)}")
    t = by_name[name]
    jinja = str(t.get("jinja", ""))
    if jinja.count("|||") != 1:
        raise TemplateError(f"{file}: template {name!r} must be 'prompt ||| target' (found {jinja.count('|||')} '|||')")
    prompt, target = jinja.split("|||")
    if not _JINJA_TARGET.match(target):
        raise TemplateError(f"{file}: template {name!r} has target {target.strip()!r}, not "
                            "'{{ answer_choices[label] }}': not a classification template biglm can convert; "
                            "write it as a biglm template instead")
    choices = t.get("answer_choices")
    if not choices or "{" in choices:
        raise TemplateError(f"{file}: template {name!r} has no plain answer_choices ({choices!r}); "
                            "pass label_words in the spec")
    converted = _JINJA_LITERAL.sub(lambda m: m.group(1) if m.group(1) is not None else m.group(2), prompt)
    converted = _JINJA_VAR.sub(lambda m: "{" + m.group(1) + "}", converted)
    if "{{" in converted or "{%" in converted or "{#" in converted:
        raise TemplateError(f"{file}: template {name!r} uses Jinja logic beyond field substitution "
                            f"({prompt.strip()[:80]!r}...); render it with promptsource, or write it as a "
                            "biglm template with {field} placeholders")
    return PromptTemplate(template=converted.strip() + " {" + ANSWER_SLOT + "}",
                          label_words=tuple(c.strip() for c in choices.split("|||")),
                          name=f"promptsource:{name}", multi_token=multi_token, options_header=options_header,
                          source=str(file))
