"""The playground of `biglm serve`: a page at ``/`` (and ``/playground``) that draws an answer's canvas as it decodes.

Why this shape: the page is plain HTML, JavaScript and CSS shipped in the package (``static/``), with no build
step and nothing fetched from elsewhere at run time. It speaks the server's public API only: ``GET /v1/decoding``
(the decoding options a request may set, with this server's defaults) fills its settings, and the step stream
(``POST /v1/completions/steps``, ``POST /v1/chat/completions/steps``) carries the canvas after every model call, so
any client can draw what the page draws (docs/serving.md).
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

from ..generation.config import DecodingConfig, describe_fields
from .protocol import EXTRA_FIELDS, OPENAI_FIELDS

FILES = {"index.html": "text/html; charset=utf-8", "playground.js": "text/javascript; charset=utf-8",
         "playground.css": "text/css; charset=utf-8"}


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
