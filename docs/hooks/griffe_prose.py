"""Griffe extension for the API reference: biglm's docstrings are prose, so Markdown must not read them as markup.

Two things in them would otherwise be taken as Markdown syntax: ``[a][b]`` (a hub source written
``hf:OWNER/NAME[:CONFIG][@SPLIT]`` reads as a reference link) and ``<mask>``-like token names (read as raw HTML, and
dropped). Outside code spans, ``][`` is escaped and ``<`` that opens no URL is written as ``&lt;``.
"""

from __future__ import annotations

import re

import griffe

_CODE = re.compile(r"(``.+?``|`[^`\n]+`)", flags=re.DOTALL)


def prose(text: str) -> str:
    parts = _CODE.split(text)
    for i in range(0, len(parts), 2):
        parts[i] = re.sub(r"<(?!https?://)", "&lt;", parts[i].replace("][", "]\\["))
    return "".join(parts)


class ProseDocstrings(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = prose(obj.docstring.value)
