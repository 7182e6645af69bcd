"""The canvas of an answer as it decodes: one `Frame` per model call, recorded by an ``on_step`` observer.

Why: a BiGLM writes by filling N slots over several calls, so its answer is best watched as a canvas: which slots are
still masked, which tokens this call wrote, which it re-masked (Mask-Predict), which drafts it kept or rejected
(speculative decoding), and how confident the model was in each token. `CanvasRecorder` turns each `StepInfo` into a
`Frame` of plain Python values at once (the tensors it reads are the decode's own and change at the next call);
`biglm serve`'s step stream (``POST /v1/completions/steps``) and `biglm generate --show` draw the same frames.

A slot's state after a call (`STATES`): ``masked`` (no token yet), ``kept`` (written by an earlier call, unchanged),
``new`` (written by this call: a prediction committed, or the token speculative decoding writes after the drafts it
kept), ``remasked`` (held a token, was masked again and predicted anew by this call, Mask-Predict's step),
``accepted`` (a speculative draft this call kept). A draft this call rejected is named per slot (``rejected``): the
slot holds the model's own token instead, or stays masked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .decoding import StepInfo

STATES = ("masked", "kept", "new", "remasked", "accepted")


@dataclass
class RowCanvas:
    """One answer row's slots after a call.

    Attributes:
        prompt: the prompt the row answers (0-based).
        length: the row's answer length (its candidate length; the slots listed).
        tokens: each slot's token id, None where masked.
        states: each slot's state (`STATES`).
        confidence: the model's probability of each slot's token when it was written (None where masked).
        rejected: the draft rejected at each slot by this call, None where none was.
    """

    prompt: int
    length: int
    tokens: list[int | None]
    states: list[str]
    confidence: list[float | None]
    rejected: list[int | None]

    @property
    def written(self) -> int:
        """Slots holding a token."""
        return sum(t is not None for t in self.tokens)

    @property
    def new_tokens(self) -> int:
        """Tokens this call wrote (new, re-written after a re-mask, or accepted drafts)."""
        return sum(s in ("new", "accepted") or (s == "remasked" and t is not None)
                   for s, t in zip(self.states, self.tokens))


@dataclass
class Frame:
    """The canvas after one model call: ``call`` (1-based) of ``total_calls`` planned (a run may stop earlier), the
    ``block`` it worked on, and one `RowCanvas` per row (per prompt and length candidate)."""

    call: int
    total_calls: int
    block: int
    rows: list[RowCanvas]

    def to_json(self, text: Callable[[int], str] | None = None) -> dict[str, Any]:
        """The frame as JSON (the server's ``step`` event): with ``text`` (a token id's text), each slot's text and
        each rejected draft's text besides the ids."""
        rows = []
        for r in self.rows:
            row: dict[str, Any] = {"prompt": r.prompt, "length": r.length, "tokens": r.tokens, "states": r.states,
                                   "confidence": [None if c is None else round(c, 4) for c in r.confidence],
                                   "rejected": r.rejected, "written": r.written, "new_tokens": r.new_tokens}
            if text is not None:
                row["text"] = [None if t is None else text(t) for t in r.tokens]
                row["rejected_text"] = [None if t is None else text(t) for t in r.rejected]
            rows.append(row)
        return {"call": self.call, "total_calls": self.total_calls, "block": self.block, "rows": rows}


@dataclass
class CanvasRecorder:
    """An ``on_step`` observer (`generate_ids`, `generate`, `DecodeEngine.submit`) that records a `Frame` per model
    call and hands it to ``on_frame`` (when given); ``keep`` False records none (a stream that sends each one on).

    ``mask_id``: the model's mask token (``config.mask_token_id``)."""

    mask_id: int
    on_frame: Callable[[Frame], None] | None = None
    keep: bool = True
    frames: list[Frame] = field(default_factory=list)
    _last: dict[int, RowCanvas] = field(default_factory=dict)  # each row's canvas after the previous call

    def __call__(self, info: StepInfo) -> None:
        out, inp = info.output_ids.tolist(), info.input_ids.tolist()
        predicted, committed, probs = info.predicted.tolist(), info.committed.tolist(), info.probs.tolist()
        drafts = None if info.drafts is None else info.drafts.tolist()
        accepted = None if info.accepted is None else info.accepted.tolist()
        lengths, prompts = info.candidate_length.tolist(), info.prompt_index.tolist()
        rows = []
        for r, n in enumerate(lengths):
            last = self._last.get(r)
            before = last.tokens if last is not None else [None] * n
            conf_before = last.confidence if last is not None else [None] * n
            tokens, states, confidence, rejected = [], [], [], []
            for s in range(n):
                tok = out[r][s]
                tok = None if tok == self.mask_id else tok
                draft = drafts[r][s] if drafts is not None else -1
                took = accepted[r][s] if accepted is not None else False
                if tok is None:
                    state = "remasked" if predicted[r][s] and before[s] is not None else "masked"
                elif took:
                    state = "accepted"
                elif predicted[r][s] and committed[r][s]:
                    # a slot that held a token before this call was masked again (its input: the mask) and re-written
                    state = "remasked" if before[s] is not None and inp[r][s] == self.mask_id else "new"
                else:
                    state = "kept"
                tokens.append(tok)
                states.append(state)
                confidence.append(None if tok is None else
                                  float(probs[r][s]) if predicted[r][s] and committed[r][s] else conf_before[s])
                rejected.append(draft if draft >= 0 and not took else None)
            rows.append(RowCanvas(prompt=prompts[r], length=n, tokens=tokens, states=states, confidence=confidence,
                                  rejected=rejected))
            self._last[r] = rows[-1]
        frame = Frame(call=info.step, total_calls=info.total_steps, block=info.block, rows=rows)
        if self.keep:
            self.frames.append(frame)
        if self.on_frame is not None:
            self.on_frame(frame)


def token_text(tokenizer: Any) -> Callable[[int], str]:
    """A token id's own text (``tokenizer.decode`` of it alone, special tokens kept), cached: what a canvas slot
    shows. A token holding part of a multi-byte character shows as U+FFFD on its own."""
    cache: dict[int, str] = {}

    def text(token: int) -> str:
        if token not in cache:
            cache[token] = tokenizer.decode([token], skip_special_tokens=False)
        return cache[token]

    return text


_CONTROL = {**{i: 0x2400 + i for i in range(32)}, 0x0A: 0x21B5, 0x7F: 0x2421}  # U+2400.. control pictures, ↵


def visible(text: str) -> str:
    """A token's text with control characters drawn (a newline as ↵, others as their control picture), so that every
    slot shows something and no token moves the cursor of a terminal being redrawn."""
    return text.translate(_CONTROL)


_STYLES = {"new": "bold green", "remasked": "bold yellow", "accepted": "bold cyan", "kept": "", "masked": "dim"}


def render_frame(frame: Frame, text: Callable[[int], str], *, labels: list[str] | None = None) -> Any:
    """A frame as rich text (`biglm generate --show`): a header with the counts, then each row's slots, masked ones
    as ░, tokens coloured by state (new green, re-masked yellow, accepted drafts cyan), a rejected draft struck
    through in red after its slot. ``labels``: each row's name (default "prompt i")."""
    from rich.text import Text

    written = sum(r.written for r in frame.rows)
    new = sum(r.new_tokens for r in frame.rows)
    out = Text()
    out.append(f"call {frame.call}/{max(frame.total_calls, frame.call)}", style="bold")
    out.append(f"  written {written}  this call {new}  tokens per call {written / frame.call:.2f}\n")
    for i, row in enumerate(frame.rows):
        label = labels[i] if labels else f"prompt {row.prompt + 1}"
        out.append(f"{label}: ", style="bold")
        for tok, state, rejected in zip(row.tokens, row.states, row.rejected):
            out.append("░" if tok is None else visible(text(tok)), style=_STYLES[state])
            if rejected is not None:
                out.append(visible(text(rejected)), style="red strike")
        out.append("\n")
    out.rstrip()
    return out


class LiveCanvas:
    """`biglm generate --show`: the canvas redrawn in place after every model call (rich's `Live` on ``console``,
    refreshed by each frame, not by a timer, so every call is drawn once). A console that is no terminal gets the last
    frame only. Use as a context manager around the decode; ``recorder`` is the ``on_step`` to pass it."""

    def __init__(self, tokenizer: Any, mask_id: int, *, console: Any = None) -> None:
        from rich.console import Console
        from rich.live import Live

        self.text = token_text(tokenizer)
        self.recorder = CanvasRecorder(mask_id, on_frame=self.draw, keep=False)
        self.console = console if console is not None else Console(stderr=True)
        self.live = Live(console=self.console, auto_refresh=False, transient=False)
        self.labels: list[str] | None = None
        self.frames = 0

    def draw(self, frame: Frame) -> None:
        if self.labels is None and len({r.length for r in frame.rows}) > 1:  # a length beam: name each candidate
            self.labels = [f"prompt {r.prompt + 1} (length {r.length})" for r in frame.rows]
        self.frames += 1
        self.live.update(render_frame(frame, self.text, labels=self.labels), refresh=True)

    def __enter__(self) -> LiveCanvas:
        self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.stop()
