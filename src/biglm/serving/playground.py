"""The playground of `biglm serve`: a page at ``/`` (and ``/playground``) that draws an answer's canvas as it decodes.

The page is plain HTML, JavaScript and CSS shipped in the package (``static/``): no build step, nothing fetched from
elsewhere at run time. It speaks the server's public API only: ``GET /v1/decoding`` (the options a request may set,
with this server's defaults) fills its settings, and the step stream (``POST /v1/completions/steps``,
``POST /v1/chat/completions/steps``) carries the canvas after every model call, so any client can draw what the page
draws (docs/serving.md). Each ``steps.call`` event carries only the slots its call changed (`FrameDeltas`), so the
stream grows with the answer, not with its square.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from importlib import resources
from typing import Any

from ..generation.canvas import Frame
from ..generation.config import DecodingConfig, describe_fields
from .protocol import EXTRA_FIELDS, OPENAI_FIELDS

FILES = {"index.html": "text/html; charset=utf-8", "playground.js": "text/javascript; charset=utf-8",
         "playground.css": "text/css; charset=utf-8", "favicon.svg": "image/svg+xml"}
SLOT_FIELDS = ("tokens", "text", "states", "confidence", "rejected", "rejected_text")
"""What a ``steps.call`` row says of each slot it lists (in ``slots``)."""


@cache
def asset(name: str) -> bytes:
    """One of the page's files (`FILES`), read from the package."""
    return (resources.files(__package__) / "static" / name).read_bytes()


def decoding_fields(defaults: DecodingConfig) -> list[dict[str, Any]]:
    """The decoding fields a request may set (`generation.config.describe_fields`), by their request names
    (``max_tokens`` for ``max_new_tokens``), with this server's defaults (``defaults``)."""
    request_name = {target: name for name, target in OPENAI_FIELDS.items()}
    out = []
    for f in describe_fields(defaults):
        name = request_name.get(f["name"], f["name"])
        if name in OPENAI_FIELDS or name in EXTRA_FIELDS:  # (use_cache is a check, not a request option)
            out.append({**f, "name": name})
    return out


class FrameDeltas:
    """The ``steps.call`` events of one answer's step stream: each call's canvas (`canvas.Frame`) as the slots that
    changed since the previous event (the first event: since every slot was masked).

    A row of an event holds ``slots`` (the changed slots' indices, ascending) and, for each of them, its token,
    text, state, confidence, rejected draft and that draft's text (`SLOT_FIELDS`, lists as long as ``slots``),
    besides the row's ``prompt``, ``length``, ``written`` and ``new_tokens``. A client keeps the canvas and writes
    each event's slots into it; a row whose length changed is listed whole again. ``text``: a token id's text."""

    def __init__(self, text: Callable[[int], str]) -> None:
        self.text = text
        self.last: dict[int, list[tuple[Any, ...]]] = {}  # row index -> each slot's (token, state, confidence, draft)

    def event(self, frame: Frame) -> dict[str, Any]:
        rows = []
        for r, row in enumerate(frame.rows):
            now = list(zip(row.tokens, row.states, row.confidence, row.rejected))
            before = self.last.get(r)
            if before is None or len(before) != len(now):
                before = [(None, "masked", None, None)] * len(now)
            slots = [s for s, (a, b) in enumerate(zip(now, before)) if a != b]
            self.last[r] = now
            tokens = [row.tokens[s] for s in slots]
            rejected = [row.rejected[s] for s in slots]
            rows.append({"prompt": row.prompt, "length": row.length, "written": row.written,
                         "new_tokens": row.new_tokens, "slots": slots, "tokens": tokens,
                         "text": [None if t is None else self.text(t) for t in tokens],
                         "states": [row.states[s] for s in slots],
                         "confidence": [None if row.confidence[s] is None else round(row.confidence[s], 4)
                                        for s in slots],
                         "rejected": rejected,
                         "rejected_text": [None if t is None else self.text(t) for t in rejected]})
        return {"call": frame.call, "total_calls": frame.total_calls, "block": frame.block, "rows": rows}
