"""The built-in default corpus: English text that every Python installation already carries.

The source ``builtin`` (`biglm.data.sources`) reads it; the demo (`biglm pretrain` with no argument) trains its
tokenizer and model on it.

Notable features
- Needs no download and copies nothing into the repository: it is read at run time from
  ``pydoc_data.topics`` (the language reference topics behind ``help("if")``) and from the
  docstrings of the standard library's modules, classes, functions and methods.
- Deterministic for a given Python build: modules, members and topics are visited in sorted
  order and duplicate docstrings (inherited or re-exported ones) are kept once.
- Collected in a child interpreter (``python -I``) so that importing ~300 modules leaves no
  trace in the caller (warning filters, signal handlers, ``readline`` hooks, printed output)
  and no site-packages module can shadow a standard one.
"""

from __future__ import annotations

import functools
import json
import os
import random
import subprocess
import sys
import tempfile

# Modules whose import has side effects (opens a browser, prints, starts a GUI, runs tests)
# or that are not real library modules. Their children are skipped too.
_SKIP_MODULES = frozenset(
    {
        "__main__", "antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo",
        "test", "lib2to3", "ensurepip", "venv", "pydoc_data", "msilib", "winreg", "winsound",
        "_msi", "nt", "msvcrt", "_winapi", "_overlapped", "xxsubtype", "xxlimited",
        "xxlimited_35", "_testcapi", "_testinternalcapi", "_testbuffer", "_testmultiphase",
        "_testimportmultiple", "_testsinglephase", "_xxsubinterpreters", "_xxtestfuzz",
        "_ctypes_test", "_testclinic", "sre_compile", "sre_constants", "sre_parse",
    }
)

# The collector runs in the child interpreter; it prints nothing and writes JSON to argv[1].
_COLLECTOR = r"""
import contextlib, importlib, inspect, io, json, pkgutil, sys, tokenize, warnings
skip = set(json.loads(sys.argv[2]))

def doc_of(obj):
    d = obj.__doc__ if isinstance(getattr(obj, "__doc__", None), str) else None
    return inspect.cleandoc(d).strip() if d else ""

def load(name):
    parts = name.split(".")
    # private submodules include __main__ (importing one runs a program); test suites are code
    if any(p in skip or p in ("test", "tests") for p in parts) or any(p.startswith("_") for p in parts[1:]):
        return None
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            return importlib.import_module(name)
    except BaseException:  # ImportError, SystemExit, platform-specific failures: skip
        return None

names = set()
for top in sorted(sys.stdlib_module_names):
    mod = load(top)
    if mod is None:
        continue
    names.add(top)
    # all submodules (email.mime.text, concurrent.futures.thread, ...), skipped ones excluded
    stack = [mod]
    while stack:
        pkg = stack.pop()
        for info in pkgutil.iter_modules(getattr(pkg, "__path__", None) or []):
            sub = load(f"{pkg.__name__}.{info.name}")
            if sub is not None:
                names.add(sub.__name__)
                stack.append(sub)

def comment_paragraphs(mod):
    # runs of consecutive comment lines joined into one paragraph; short ones are mostly code
    path = getattr(mod, "__file__", None) or ""
    if not path.endswith(".py"):
        return []
    try:
        with open(path, "rb") as f:
            toks = list(tokenize.tokenize(f.readline))
    except (OSError, SyntaxError, tokenize.TokenError):
        return []
    paras, block, last = [], [], -2
    for t in toks + [tokenize.TokenInfo(tokenize.COMMENT, "#", (10**9, 0), (10**9, 1), "")]:
        if t.type != tokenize.COMMENT:
            continue
        if t.start[0] != last + 1 and block:
            para = " ".join(block).strip()
            if len(para.split()) >= 8:
                paras.append(para)
            block = []
        block.append(t.string.lstrip("#!").strip())
        last = t.start[0]
    return paras

seen, docs = set(), []
def add(text, parts):
    if len(text) >= 40 and text not in seen:  # one-liners like "Return self==value." add noise
        seen.add(text)
        parts.append(text)

for name in sorted(names):
    mod = load(name)
    if mod is None:
        continue
    parts = []
    add(doc_of(mod), parts)
    for attr in sorted(vars(mod)):
        if attr.startswith("__"):
            continue
        obj = vars(mod)[attr]
        if getattr(obj, "__module__", None) != mod.__name__:
            continue  # re-exported: documented in its own module
        if inspect.isclass(obj):
            add(doc_of(obj), parts)
            for meth in sorted(vars(obj)):
                member = vars(obj)[meth]
                if isinstance(member, (classmethod, staticmethod)):
                    member = member.__func__
                if not meth.startswith("__") or meth == "__init__":
                    add(doc_of(member), parts)
        elif callable(obj):
            add(doc_of(obj), parts)
    for para in comment_paragraphs(mod):
        add(para, parts)
    if parts:
        docs.append("\n\n".join(parts))

from pydoc_data.topics import topics
topic_docs = [topics[k].strip() for k in sorted(topics) if topics[k].strip()]
with open(sys.argv[1], "w", encoding="utf-8") as f:
    # some topics share one text (e.g. aliases): keep each document once, first occurrence
    json.dump(list(dict.fromkeys(topic_docs + docs)), f)
"""


@functools.lru_cache(maxsize=1)
def _collect() -> tuple[str, ...]:
    with tempfile.TemporaryDirectory(prefix="biglm-builtin-") as tmp:
        out = os.path.join(tmp, "corpus.json")
        proc = subprocess.run(
            [sys.executable, "-I", "-c", _COLLECTOR, out, json.dumps(sorted(_SKIP_MODULES))],
            capture_output=True, text=True, timeout=600,
            # no display: a module that still reaches for a GUI fails instead of opening one
            env={k: v for k, v in os.environ.items() if k not in {"DISPLAY", "WAYLAND_DISPLAY"}},
        )
        if proc.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(
                f"collecting the built-in corpus failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}"
            )
        with open(out, encoding="utf-8") as f:
            return tuple(json.load(f))


def builtin_corpus() -> list[str]:
    """Return the built-in corpus as a deterministic list of documents.

    One document per ``pydoc`` topic and one per standard-library module (its docstring
    followed by the docstrings of its public classes, methods and functions), in a fixed
    shuffled order: a held-out split taken from the front (``prepare(val_docs=N)``) then mixes
    language-reference topics and library docs like the training split does, instead of being
    all topics. The result is cached for the life of the process.
    """
    docs = list(_collect())
    random.Random(20250701).shuffle(docs)
    if not docs:
        raise RuntimeError("the built-in corpus is empty: this Python installation carries no docstrings "
                           "(was it run with -OO?); pass a text source instead")
    return docs
