"""The playground of `biglm serve`: a page at ``/`` (and ``/playground``) that draws an answer's canvas as it decodes.

Why this shape: the page is plain HTML, JavaScript and CSS shipped in the package (``static/``), with no build
step and nothing fetched from elsewhere at run time. It speaks the server's public API only: ``GET /v1/decoding``
(the decoding options a request may set, with this server's defaults) fills its settings, and the step stream
(``POST /v1/completions/steps``, ``POST /v1/chat/completions/steps``) carries the canvas after every model call, so
any client can draw what the page draws (docs/serving.md).
"""

from __future__ import annotations

import dataclasses
import typing
from functools import cache
from importlib import resources
from typing import Any, Literal

from ..config import field_docs
from ..generation.config import DecodingConfig
from .protocol import EXTRA_FIELDS, OPENAI_FIELDS

FILES = {"index.html": "text/html; charset=utf-8", "playground.js": "text/javascript; charset=utf-8",
         "playground.css": "text/css; charset=utf-8"}


@cache
def asset(name: str) -> bytes:
    """One of the page's files (`FILES`), read from the package."""
    return (resources.files(__package__) / "static" / name).read_bytes()


def _kind(tp: Any, choices: Any) -> tuple[str, list[Any] | None, bool]:
    """(kind, choices, optional) of a `DecodingConfig` field's type, as the page's inputs need it."""
    args = typing.get_args(tp)
    optional = type(None) in args
    if optional:
        (tp,) = [a for a in args if a is not type(None)]
    if typing.get_origin(tp) is Literal:
        return "choice", list(typing.get_args(tp)), optional
    if choices:
        return "choice", list(choices), optional
    if typing.get_origin(tp) is list:
        return "list", None, optional
    return {bool: "bool", int: "int", float: "float"}.get(tp, "text"), None, optional


def decoding_fields(defaults: DecodingConfig) -> list[dict[str, Any]]:
    """The decoding fields a request may set, by their request names (``max_tokens`` for ``max_new_tokens``), in
    `DecodingConfig`'s order: each one's kind (int, float, bool, choice, list, text), choices, whether it may be left
    unset (null), this server's default (``defaults``) and its help (the field's docstring)."""
    request_name = {target: name for name, target in OPENAI_FIELDS.items()}
    hints, docs = typing.get_type_hints(DecodingConfig), field_docs(DecodingConfig)
    out = []
    for f in dataclasses.fields(DecodingConfig):
        name = request_name.get(f.name, f.name)
        if name not in OPENAI_FIELDS and name not in EXTRA_FIELDS:
            continue  # not a request option (use_cache)
        kind, choices, optional = _kind(hints[f.name], f.metadata.get("choices"))
        out.append({"name": name, "kind": kind, "choices": choices, "optional": optional,
                    "default": getattr(defaults, f.name), "help": docs.get(f.name, "")})
    return out
