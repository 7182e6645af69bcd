"""`DecodingConfig`: every decoding option in one object, validated once (as HF's ``GenerationConfig``).

Every entry point (Python `generate`, `biglm generate` and `biglm chat`, batch files, the lm-eval adapter's
``generate_until``, the server) builds one, unless given one, through `model_decoding` (the model's saved settings,
then the caller's options), and `api` hands it to the loops in `decoding`; a bad value fails when the object is built, in one message
naming the field and the fix, before any model call. Field docstrings are the CLI's help text, and field types stay
simple (int, float, str, bool, ``X | None``, ``list[str]``, ``Literal``) so a typed parser builds the object from flags
or YAML. ``strategy`` is checked against the registry (`strategies.STRATEGIES`), so a new strategy is accepted
everywhere without an edit here.

Defaults: the published Mask-Predict (Ghazvininejad et al. 2019; T iterations are T model calls), in one block with
the exact cache on the paper's models (the block settings were chosen by measurement: docs/LOG.md). A model on which
drafts are checked exactly (a `biglm-blocks` model trained on blocks of 1, what `blocks-adapt` makes) has its own
default at the entry points, `drafting_default`: speculative decoding with n-gram drafts, one token per call's answer
in fewer calls, unless an option that chooses how to decode is given or saved.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from ..model.config import append_only_prefix
from .strategies import DEFAULT_MASK_PREDICT_STEPS, STRATEGIES, get_strategy  # noqa: F401  (re-exported)

SEEDS = 2**64  # seeds are 0 .. SEEDS - 1
BlockSuffix = Literal["block", "rest"]
BlockCache = Literal["exact", "append"]


class DecodingError(ValueError):
    """A decoding value that is refused; ``option`` names the field the message is about (None: no single one), so
    `model_decoding` can say where that value came from when the user did not give it."""

    def __init__(self, message: str, *, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option


# why `decoding.Decode` (iterative unmasking) refuses speculative decoding, and where that runs, said once
SPECULATIVE_ALONE = ("speculative decoding (draft_length) is a state machine of its own, speculative.SpeculativeDecode,"
                     " which generate_ids / generate / biglm generate and the server's engine build for such a config; "
                     "Decode runs iterative unmasking only: set draft_length=0 here.")


@dataclass(frozen=True)
class DecodingConfig:
    """How `generate` writes an answer by iterative unmasking: an all-mask answer of N slots, unmasked over T
    model calls by a decoding strategy."""

    max_new_tokens: int = 64
    """answer slots N (the answer is cut at the first EOS, so it may be shorter)"""
    steps: int | None = None
    """model calls T (unset: 10 for mask-predict, N for confidence/threshold)"""
    strategy: str = field(default="mask-predict", metadata={"choices": STRATEGIES})
    """a registered decoding strategy (`generation.strategies`): mask-predict (re-mask the least confident),
    confidence (LLaDA: commit the most confident) or threshold (Fast-dLLM)"""
    temperature: float = 0.0
    """sampling temperature; 0 = greedy"""
    top_k: int | None = None
    """sample among the k most likely tokens only (unset: no top-k filter)"""
    top_p: float | None = None
    """sample from the smallest set of tokens whose probability reaches p, in (0, 1] (unset: no nucleus filter)"""
    seed: int = 0
    """seed of the sampler's random stream (a run is reproducible), in [0, 2**64)"""
    length_beam: int = 1
    """candidate answer lengths in [ceil(N/2), N] decoded side by side; the most likely one is kept"""
    block_length: int | None = None
    """blocks of this many slots, decoded left to right; a finished block joins the prefix cache (unset: one block
    for the paper's models; for `biglm-blocks` models the smallest trained block length that holds a call's tokens,
    ceil(N / steps), else the largest)"""
    block_suffix: BlockSuffix = "block"
    """with blocks, the suffix each step runs: the current block only, or the block plus all remaining masks (rest)"""
    block_cache: BlockCache | None = None
    """with blocks, how a finished block joins the prefix cache: exact (prompt + finished blocks re-encoded as
    one BiGLM prefix) or append (only the block is encoded; earlier tokens never see it: linear cost). Unset:
    what the model was trained for — exact for the paper's models (append is an approximation there, and
    warns), append for `biglm-blocks` models (prefix_attention="blocks"), where it is exact"""
    length_head: bool | None = None
    """candidate lengths from the model's length head (unset: use it when the model has one)"""
    threshold: float = 0.9
    """τ of the threshold strategy: commit every prediction above it (at least one per step)"""
    stop: list[str] = field(default_factory=list, metadata={"repeatable": True})
    """cut the answer at the first of these strings (the string itself is dropped)"""
    use_cache: bool = True
    """exact prefix cache: encode the prompt once (false recomputes it every step, for checking)"""
    early_stop: bool = False
    """mask-predict only: end a row once an iteration changes none of its tokens (fewer than T calls;
    off = the published algorithm)"""
    ignore_eos: bool = False
    """never write the end-of-text token: every answer runs to max_new_tokens (what benchmark clients send, as vLLM
    accepts it, so that every server writes the same number of tokens)"""
    draft_length: int = 0
    """speculative decoding (`generation.speculative`): every model call checks this many drafted tokens against
    the model's own one-token-per-call prediction and commits the run that agrees plus one more. The answer is the one
    of confidence decoding at blocks of 1, one token per call, in fewer calls; it needs strategy=confidence and
    leaves steps and block_length unset (0 = off)"""
    draft_ngram: int = 0
    """speculative decoding: also draft by n-gram lookup (prompt lookup decoding, as vLLM's n-gram speculator): where
    the text so far (prompt and answer) ends with an n-gram seen earlier in it, n up to this, the drafts are the tokens
    that followed it there; elsewhere the model's own. Drafts are only checked guesses: the answer is the same
    (0 = the model's drafts only)"""
    draft_model: bool = True
    """speculative decoding: the model drafts the next call's tokens with its own mask slots (a block of
    draft_length + 1 masks for each length the accepted run may have: (m + 1)^2 more positions a call); false: n-gram
    drafts only (draft_ngram), a call then runs the pending tokens and their checks alone (but see draft_fill)"""
    draft_fill: bool = True
    """speculative decoding with draft_model=false: a call that has no n-gram draft to check (the text so far never
    showed its last token before) carries one block of draft_length + 1 masks after its token, whose predictions
    are the next call's drafts, so that every call has drafts to check: 1 + m positions instead of 2 (their cost is
    the machine's: see draft_measure). Like every draft only a guess: the answer is the same. Dropped with the model's
    drafts under load (rows above `speculative.DRAFT_ROWS`)"""
    draft_measure: bool = True
    """speculative decoding with draft_fill, greedy (draft_accept 1), float32, on a model loaded for inference
    (`checkpoint.load_model`): draft_fill's block rides only while it pays on this machine, measured as decoding goes
    (`speculative.DraftCosts`: calls with the block timed against calls without it, and the tokens its drafts gave);
    false: in every call that has nothing to check. The answer is the same either way"""
    draft_branches: int = 1
    """speculative decoding, greedy, with draft_model=false: a call checks up to this many different drafts at once
    (the continuations of the latest matches of the n-gram, then the model's next-best first tokens from a
    draft_fill call), merged into a tree whose shared beginnings are checked once: one more position per distinct
    drafted token. The path the checks agree with is kept; the answer is the same (1 = one draft a call)"""
    draft_accept: float = 1.0
    """speculative decoding, greedy only: a drafted token is kept when its probability is at least this fraction of
    the most likely token's. 1 keeps only the token greedy decoding writes (the exact answer); lower keeps more
    tokens per call, and the answer may differ"""

    def __post_init__(self) -> None:
        hints = _hints()
        for f in dataclasses.fields(DecodingConfig):  # (subclasses such as the CLI's add fields of their own)
            value = _check_type(f.name, getattr(self, f.name), hints[f.name])
            object.__setattr__(self, f.name, value)  # normalised: int -> float, str/tuple -> list
        strategy = get_strategy(self.strategy)  # an unknown name is refused, listing the registered ones
        if self.max_new_tokens < 1:
            raise DecodingError(f"max_new_tokens={self.max_new_tokens} must be >= 1.", option="max_new_tokens")
        if self.steps is not None and self.steps < 1:
            raise DecodingError(f"steps={self.steps} must be >= 1 (or unset for the strategy's default).",
                                option="steps")
        if not 0 <= self.seed < SEEDS:  # what torch.Generator.manual_seed holds (a 64-bit unsigned integer)
            raise DecodingError(f"seed={self.seed} must be an integer in [0, 2**64 - 1] (what a 64-bit generator holds).",
                                option="seed")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise DecodingError(f"temperature={self.temperature} must be a finite number >= 0 (0 = greedy).",
                                option="temperature")
        if self.top_k is not None and self.top_k < 1:
            raise DecodingError(f"top_k={self.top_k} must be >= 1 (or unset for no top-k filtering).", option="top_k")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise DecodingError(f"top_p={self.top_p} must lie in (0, 1] (or unset for no nucleus filtering).",
                                option="top_p")
        if self.length_beam < 1:
            raise DecodingError(f"length_beam={self.length_beam} must be >= 1.", option="length_beam")
        if self.block_length is not None:
            if self.block_length < 1:
                raise DecodingError(f"block_length={self.block_length} must be >= 1 (or unset for one block).",
                                    option="block_length")
        if not 0.0 <= self.threshold <= 1.0:
            raise DecodingError(f"threshold={self.threshold} must lie in [0, 1].", option="threshold")
        if self.draft_length < 0:
            raise DecodingError(f"draft_length={self.draft_length} must be >= 0 (0 = no speculative decoding).",
                                option="draft_length")
        if self.draft_ngram < 0:
            raise DecodingError(f"draft_ngram={self.draft_ngram} must be >= 0 (0 = the model's drafts only).",
                                option="draft_ngram")
        if not self.draft_model and not self.draft_ngram:
            raise DecodingError("draft_model=false leaves n-gram lookup as the only draft source: set draft_ngram >= 1 "
                                "(or draft_model=true).", option="draft_model")
        if self.draft_ngram and not self.draft_length:
            raise DecodingError("draft_ngram drafts for speculative decoding: set draft_length >= 1 too.",
                                option="draft_ngram")
        if not 0.0 < self.draft_accept <= 1.0:
            raise DecodingError(f"draft_accept={self.draft_accept} must lie in (0, 1] (1 = exact).",
                                option="draft_accept")
        if self.draft_branches < 1:
            raise DecodingError(f"draft_branches={self.draft_branches} must be >= 1 (1 = one draft a call).",
                                option="draft_branches")
        if self.draft_length:
            self._check_speculative()
        elif self.draft_accept != 1.0:
            raise DecodingError("draft_accept applies to speculative decoding only: set draft_length >= 1 too.",
                                option="draft_accept")
        if self.early_stop and not strategy.remasks:
            remaskers = ", ".join(name for name, cls in STRATEGIES.items() if cls.remasks)
            raise DecodingError(f"early_stop applies to {remaskers} only; strategy={self.strategy!r} never re-masks a "
                                "token, so there is nothing to stop: set early_stop=False.", option="early_stop")

    def _check_speculative(self) -> None:
        """Speculative decoding reproduces confidence decoding at blocks of 1, one token per call: refuse what it
        would otherwise ignore."""
        why = "draft_length (speculative decoding) writes the answer of confidence decoding at blocks of 1, one token per call"
        if self.strategy != "confidence":
            raise DecodingError(f"{why}: set strategy='confidence' (got {self.strategy!r}), or draft_length=0.",
                                option="strategy")
        for name, value, ok in (("steps", self.steps, None), ("block_length", self.block_length, 1),
                                ("block_suffix", self.block_suffix, "block"), ("block_cache", self.block_cache, "append"),
                                ("length_beam", self.length_beam, 1), ("use_cache", self.use_cache, True)):
            if value is not None and value != ok:
                raise DecodingError(f"{why}, with the append cache: {name}={value!r} does not apply; leave it "
                                    f"{'unset' if ok is None else repr(ok)}, or set draft_length=0.", option=name)
        if self.draft_model and not self.draft_fill:
            raise DecodingError("draft_fill=false applies to calls without the model's mask blocks (draft_model=false, "
                                "n-gram drafts); with draft_model=true every call carries them: set draft_model=false "
                                "too, or leave draft_fill unset.", option="draft_fill")
        if not self.draft_measure and (self.draft_model or not self.draft_fill):
            raise DecodingError("draft_measure=false keeps draft_fill's block in every call that has nothing to check; "
                                "it applies with draft_model=false and draft_fill=true: set those, or leave "
                                "draft_measure unset.", option="draft_measure")
        if self.draft_branches > 1 and self.temperature > 0.0:
            raise DecodingError("draft_branches > 1 checks several drafts greedily; sampling (temperature > 0) keeps "
                                "one draft a call, whose acceptance keeps the sampled answer's distribution: set "
                                "draft_branches=1.", option="draft_branches")
        if self.draft_branches > 1 and self.draft_model:
            raise DecodingError("draft_branches > 1 builds its tree in calls without the model's mask blocks: set "
                                "draft_model=false (the model's drafts then come from draft_fill's calls) and "
                                "draft_ngram >= 1.", option="draft_branches")
        if self.draft_accept < 1.0 and self.temperature > 0.0:
            raise DecodingError("draft_accept < 1 is for greedy decoding; sampling (temperature > 0) accepts a draft "
                                "with its probability, which keeps the sampled answer's distribution: set "
                                "draft_accept=1.", option="draft_accept")

    def override(self, **changes: Any) -> DecodingConfig:
        """A copy with ``changes`` applied and validated again; an unknown name is refused, naming the valid ones."""
        unknown = sorted(set(changes) - set(FIELDS))
        if unknown:
            raise ValueError(f"unknown decoding option(s) {', '.join(unknown)}: choose from {', '.join(FIELDS)}.")
        return dataclasses.replace(self, **changes) if changes else self

    def num_steps(self, answer_length: int) -> int:
        """Model calls T for an answer of ``answer_length`` slots (the strategy's default when unset)."""
        if self.steps is not None:
            return self.steps
        return get_strategy(self.strategy).default_steps(answer_length)


FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(DecodingConfig))
SAVED_KEY = "seq2seq"  # config.task_specific_params key under which a fine-tuning export records its decoding
SAVED_FIELDS = ("max_new_tokens", "steps", "length_beam")  # the decoding settings such an export records


def saved_decoding(model_config: Any) -> dict[str, Any]:
    """The `DecodingConfig` values a fine-tuned model was saved with (``task_specific_params["seq2seq"]``)."""
    params = (getattr(model_config, "task_specific_params", None) or {}).get(SAVED_KEY) or {}
    return {k: params[k] for k in SAVED_FIELDS if isinstance(params.get(k), int) and not isinstance(params[k], bool)}


def saved_where(model_config: Any) -> str:
    """Where a model's saved decoding settings are read from, for messages."""
    path = getattr(model_config, "name_or_path", "") or ""
    return f"task_specific_params.{SAVED_KEY} in {Path(path) / 'config.json' if path else 'its config.json'}"


# a drafting model's default drafts: n-gram lookup (up to trigrams) of 4 tokens a call, and the model's own mask
# drafts only in a call that has no n-gram draft to check (``draft_fill``): a mask block in every call runs (m + 1)^2
# more positions, which cost more than their drafts saved when measured (docs/LOG.md, the benchmarks page)
DEFAULT_DRAFT_LENGTH = 4
DEFAULT_DRAFT_NGRAM = 3
SHAPE_FIELDS = ("strategy", "steps", "block_length", "block_suffix", "block_cache", "length_beam", "use_cache",
                "threshold", "early_stop", "draft_length", "draft_ngram", "draft_accept")
"""The fields that choose how an answer is decoded (rather than what is sampled or how long): one given, or saved with
the model, and the model's default decoding (`drafting_default`) steps aside for the user's."""


def drafts_exactly(model_config: Any) -> bool:
    """Whether speculative decoding writes exactly what one token per call writes on this model: a `biglm-blocks`
    model trained on blocks of 1, whose append cache is exact at blocks of 1 (`blocks-adapt` makes them), or a causal
    one (`biglm convert`'s), whose text is read as its AR source read it."""
    return append_only_prefix(model_config) and 1 in (getattr(model_config, "prefix_block_lengths", None) or ())


def drafting_default(model_config: Any) -> dict[str, Any]:
    """A model's own default decoding, under the saved settings and the options given: for a model on which drafts are
    checked exactly (`drafts_exactly`), one token per call written in fewer calls (confidence at blocks of 1 with
    ``DEFAULT_DRAFT_LENGTH`` drafts a call from n-gram lookup, the fastest exact setting measured): the same answer as
    ``--strategy confidence --block_length 1 --draft_length 0`` (greedy, float32), the same distribution sampled. Other
    models: {} (the
    paper's models keep Mask-Predict, the published algorithm: drafts are not exact under a bidirectional prefix)."""
    if not drafts_exactly(model_config):
        return {}
    return {"strategy": "confidence", "draft_length": DEFAULT_DRAFT_LENGTH, "draft_ngram": DEFAULT_DRAFT_NGRAM,
            "draft_model": False}


def model_default_fields(model_config: Any, overrides: Mapping[str, Any] | None = None) -> tuple[str, ...]:
    """The fields `model_decoding` takes from the model's own default decoding (`drafting_default`) under the saved
    settings and ``overrides``: all of them, or none when an option that chooses how to decode (`SHAPE_FIELDS`) was
    saved or given. A server that built its defaults so resets these fields when a request names such an option
    (`serving.protocol.decoding_config`), as `biglm generate` does for its flags."""
    if set(SHAPE_FIELDS) & (set(saved_decoding(model_config)) | set(overrides or {})):
        return ()
    return tuple(drafting_default(model_config))


def decoding_origins(model_config: Any, overrides: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Where each `DecodingConfig` value of `model_decoding` comes from: "given" (``overrides``), "model" (the
    model's saved settings, `saved_decoding`) or "default"; what a refusal reads to say who set the value."""
    saved, given = saved_decoding(model_config), overrides or {}
    return {name: "given" if name in given else "model" if name in saved else "default" for name in FIELDS}


def model_decoding(model_config: Any, overrides: Mapping[str, Any] | None = None, *,
                   clear: str = "--{name} {value}") -> DecodingConfig:
    """A model's decoding settings at an entry point: the defaults, the model's own default decoding where no option
    that chooses how to decode was saved or given (`drafting_default`), then the settings the model was saved with
    (`saved_decoding`), then ``overrides``, the options the entry point was given explicitly (flags on the
    command line, a server's ``--decoding.FIELD``), validated once. `biglm generate`, `biglm chat` and
    `biglm serve` all build their settings here, so they decode a model the same way.

    A value refused that the user never gave (the model's saved one, `decoding_origins`) is said to be the model's,
    with where it was read and how to put the default back: ``clear`` is the entry point's spelling of that, formatted
    with the field's ``name``, its default as a flag ``value`` (none, 1) and as ``json`` (null, 1): the commands'
    ``--steps none``, the server's ``--decoding.{name} {value}``, a batch row's ``"{name}": {json}``."""
    saved, given = saved_decoding(model_config), dict(overrides or {})
    model_default = {name: value for name, value in drafting_default(model_config).items()
                     if name in model_default_fields(model_config, given)}
    try:
        return _speculative_only(DecodingConfig().override(**{**model_default, **saved, **given}))
    except DecodingError as e:
        if e.option is None or decoding_origins(model_config, given)[e.option] != "model":
            raise
        default = getattr(DecodingConfig(), e.option)
        value = "none" if default is None else str(default).lower() if isinstance(default, bool) else str(default)
        how = clear.format(name=e.option, value=value, json=json.dumps(default))
        raise DecodingError(f"{e} {e.option}={saved[e.option]!r} is not an option given here but the model's saved "
                            f"decoding setting ({saved_where(model_config)}): "
                            f"{'clear' if default is None else 'override'} it with {how}.", option=e.option) from None


def _speculative_only(config: DecodingConfig) -> DecodingConfig:
    """``config``, refused where it asks for a tree of drafts (``draft_branches``) without speculative decoding. Checked
    on the settings a decode runs with (`model_decoding`, `for_model`), not on each option alone: ``--draft_branches
    2`` alone adds to a drafting model's default speculative decoding."""
    if config.draft_branches != 1 and not config.draft_length:
        raise DecodingError("draft_branches applies to speculative decoding only, which these settings do not run "
                            "(draft_length 0): set draft_length >= 1 too, or leave draft_branches at 1.",
                            option="draft_branches")
    return config


def for_model(config: DecodingConfig, model_config: Any) -> DecodingConfig:
    """``config`` with the block options a model's training implies filled in (what every decode runs with).

    A ``prefix_attention="blocks"`` model (the `biglm-blocks` objective) decodes block by block with the append
    cache by default, which is exact for it, in blocks of the smallest trained length that holds the tokens one call
    writes (ceil(N / steps); none holds them: the largest). A call runs its block's masks and, once per block, the
    block before it joining the cache, so positions per token grow with the block, and small blocks were judged to
    write no worse (measured: docs/LOG.md); one token per call on a model trained
    on blocks of 1 is blocks of 1, the AR-like exact decoding (2 positions per token). A paper model keeps one block
    and the exact (re-encoding) cache; asking it for the append cache warns that this is an approximation."""
    blocks_model = append_only_prefix(model_config)
    changes: dict[str, Any] = {}
    _speculative_only(config)
    if config.draft_length:
        if not blocks_model:
            warnings.warn("speculative decoding (draft_length) checks each draft under the append cache at blocks of 1: "
                          "on a model trained with a bidirectional prefix that is an approximation (earlier answer "
                          "tokens never see later ones); a biglm-blocks model was trained for it", stacklevel=3)
        elif 1 not in model_config.prefix_block_lengths:
            warnings.warn(untrained_blocks_of_one(model_config), stacklevel=3)
        return dataclasses.replace(config, block_length=1, block_cache="append")
    if blocks_model:
        if config.block_cache is None:
            changes["block_cache"] = "append"
        if config.block_length is None:
            lengths = sorted(model_config.prefix_block_lengths)
            per_call = -(-config.max_new_tokens // config.num_steps(config.max_new_tokens))  # tokens one call writes
            changes["block_length"] = next((b for b in lengths if b >= per_call), lengths[-1])
    else:
        if config.block_cache is None:
            changes["block_cache"] = "exact"
        elif config.block_cache == "append" and config.block_length is not None:
            warnings.warn("block_cache='append' on a model trained with a bidirectional prefix is an approximation: "
                          "earlier prefix tokens never see a finished block, a condition it was not trained on (exact: "
                          "block_cache='exact', or a biglm-blocks model)", stacklevel=3)
    return dataclasses.replace(config, **changes) if changes else config


def untrained_blocks_of_one(model_config: Any, *,
                            use: str = "speculative decoding (draft_length) checks every token as a block of 1") -> str:
    """The warning for running a model at blocks of 1 (``use`` says what does: speculative decoding, or the ``append``
    scorer) when its training never drew them (the biglm-blocks objective's default block lengths are 8, 16 and 32; a
    paper model's prefix is bidirectional): it then runs a condition the model never saw. One text, one remedy."""
    lengths = sorted(model_config.prefix_block_lengths)
    trained = (f"prefix blocks of {', '.join(map(str, lengths))} only (prefix_block_lengths in its config.json; the "
               "biglm-blocks objective's default is 8, 16, 32)" if lengths else
               "a bidirectional prefix (prefix_attention in its config.json), so its answer keys never learned to be causal")
    return (f"{use}, but this model was trained on {trained}: blocks of 1 are a condition its training never drew. To "
            "train it on them, adapt it with blocks of 1 included: biglm pretrain blocks-adapt --init_from MODEL "
            f"--objective.prefix_blocks {','.join(map(str, [1, *(lengths or [8, 16, 32])]))}")


@functools.cache
def _hints() -> dict[str, Any]:
    return typing.get_type_hints(DecodingConfig)


def _check_type(name: str, value: Any, tp: Any) -> Any:
    """``value`` as field type ``tp`` (ints are floats too; a lone string is a one-item list), or a ValueError."""
    origin, args = get_origin(tp), get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _check_type(name, value, inner)
    if origin is Literal:
        if value not in args:
            raise DecodingError(f"{name}={value!r}: choose one of {', '.join(map(str, args))}.", option=name)
        return value
    if origin is list:
        if value is None:
            return []
        if isinstance(value, str):
            return [value]
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return list(value)
        raise DecodingError(f"{name}={value!r} must be a list of strings.", option=name)
    if tp is bool:
        if not isinstance(value, bool):
            raise DecodingError(f"{name}={value!r} must be true or false.", option=name)
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise DecodingError(f"{name}={value!r} must be an integer.", option=name)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise DecodingError(f"{name}={value!r} must be a number.", option=name)
        return float(value)
    if tp is str and not isinstance(value, str):
        raise DecodingError(f"{name}={value!r} must be a string.", option=name)
    return value


def describe_fields(config: DecodingConfig) -> list[dict[str, Any]]:
    """Each `DecodingConfig` field as a form needs it (the playground's settings): its name, kind (int, float, bool,
    choice, list, text), choices, whether it may be unset (None), its value in ``config`` and its help (the field's
    docstring, as the commands' --help shows it)."""
    from ..config import field_docs

    hints, docs, out = _hints(), field_docs(DecodingConfig), []
    for f in dataclasses.fields(DecodingConfig):
        tp, choices = hints[f.name], f.metadata.get("choices")
        optional = type(None) in get_args(tp)
        if optional:
            (tp,) = [a for a in get_args(tp) if a is not type(None)]
        if get_origin(tp) is Literal or choices:
            kind, choices = "choice", list(choices or get_args(tp))
        else:
            kind = "list" if get_origin(tp) is list else {bool: "bool", int: "int", float: "float"}.get(tp, "text")
        out.append({"name": f.name, "kind": kind, "choices": choices, "optional": optional,
                    "default": getattr(config, f.name), "help": docs.get(f.name, "")})
    return out
