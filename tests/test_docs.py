"""The front door: README stays short and its code runs, the documentation site builds, its tables are current.

- README.md has at most 250 lines.
- README's code blocks, each marked by the HTML comment before its fence:
  ``<!-- test: run -->`` blocks run as written (bash or Python, in a temporary folder, with a timeout);
  ``<!-- test: parse -->`` blocks are the expensive ones (a conversion, a training run, a server): each ``biglm``
  command in them (after the shell expands the block's variables; ``torchrun ... -m biglm`` included) is parsed
  with ``--print_config``, which checks every option's name and type against the command's typed config and does
  no work; a Python block is compiled. ``<!-- test: ci -->`` marks the set-up commands
  (``bash scripts/quickstart.sh demo|test``): a fresh machine's job, which CI runs (.ci/run runs the test one as
  written); here they are checked to name the script's cases. Every fence carries one of the marks.
- The tables README and the site show are what ``python benchmarks/tables.py`` makes from the result files.
- ``mkdocs build --strict`` passes (broken links, missing pages and docstring warnings fail it); skipped when
  mkdocs is not installed (``pip install -e ".[docs]"``; scripts/quickstart.sh installs it).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
FENCE = re.compile(r"(?:<!-- test: (?P<mark>\w+) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)\n```", re.DOTALL)
# a parsed command may name inputs an earlier step of the README makes (a converted model, a run): its check of
# those is no parse error
MISSING_INPUT = ("no model at", "no such directory", "does not exist", "not found")


def readme_blocks() -> list[tuple[str, str, str]]:
    """(mark, language, body) of every fenced block in README.md."""
    return [(m["mark"] or "", m["lang"], m["body"]) for m in FENCE.finditer(README.read_text())]


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail into a guide (docs/guides/)"


def test_every_readme_block_is_marked():
    unmarked = [body.splitlines()[0] for mark, _, body in readme_blocks() if mark not in {"run", "parse", "ci"}]
    assert not unmarked, f"README blocks without <!-- test: run|parse|ci -->: {unmarked}"


def test_readme_setup_commands_are_the_scripts():
    """The two set-up commands are quickstart.sh's cases, and CI runs the test one exactly as README gives it."""
    script = (REPO / "scripts" / "quickstart.sh").read_text()
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    bodies = [body for mark, _, body in readme_blocks() if mark == "ci"]
    assert {b.split()[-1] for b in bodies} == {"demo", "test"}, bodies
    for body in bodies:
        assert re.fullmatch(r"bash scripts/quickstart\.sh (demo|test)", body), body
        assert f"  {body.split()[-1]})" in script, f"scripts/quickstart.sh has no case for {body!r}"
    assert "bash scripts/quickstart.sh test" in ci, ".ci/run no longer runs README's test command"


def _env() -> dict[str, str]:
    bindir = str(Path(sys.executable).parent)  # the environment's `biglm` script, whichever python runs the tests
    return {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", ""), "OMP_NUM_THREADS": "1"}


@pytest.mark.parametrize("index", [i for i, (mark, _, _) in enumerate(readme_blocks()) if mark == "run"])
def test_readme_block_runs(index, tmp_path):
    _, lang, body = readme_blocks()[index]
    if lang == "python":
        cmd = [sys.executable, "-c", body]
    else:
        assert lang in {"bash", "sh"}, lang
        cmd = ["bash", "-euo", "pipefail", "-c", body]
    proc = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"README block failed:\n{body}\n--- stderr:\n{proc.stderr[-3000:]}"


def _biglm_calls(body: str, tmp_path: Path) -> list[list[str]]:
    """Each ``biglm`` (or ``torchrun ... -m biglm``) call in a bash block, as argv after the shell's expansion: the
    block runs in bash with ``biglm`` and ``torchrun`` as functions that only record their arguments."""
    calls = tmp_path / "calls"
    prelude = ('biglm() { [ -t 0 ] || cat > /dev/null; for a in "$@"; do printf "%s\\0" "$a"; done >> "$CALLS"; '
               'printf "\\036\\0" >> "$CALLS"; }\n'
               'torchrun() { while [ "$#" -gt 0 ] && [ "$1" != "-m" ]; do shift; done; shift 2; biglm "$@"; }\n')
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", prelude + body], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env={**_env(), "CALLS": str(calls)}, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"README block failed in bash:\n{body}\n{proc.stderr}"
    argv: list[str] = []
    out = []
    for item in calls.read_text().split("\0")[:-1]:
        if item == "\x1e":
            out.append(argv)
            argv = []
        else:
            argv.append(item)
    return out


@pytest.mark.parametrize("index", [i for i, (mark, _, _) in enumerate(readme_blocks()) if mark == "parse"])
def test_readme_block_parses(index, tmp_path):
    _, lang, body = readme_blocks()[index]
    if lang == "python":
        compile(body, "README.md", "exec")
        return
    from biglm.cli import main

    calls = _biglm_calls(body, tmp_path)
    assert calls, f"no biglm command in:\n{body}"
    cwd = os.getcwd()
    os.chdir(REPO)  # relative paths as a reader at the repository root gives them
    try:
        for argv in calls:
            err, out = io.StringIO(), io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
                code = main([*argv, "--print_config"])
            message = err.getvalue().strip()
            assert code == 0 or (code == 2 and any(m in message for m in MISSING_INPUT)), (
                f"`biglm {' '.join(argv)}` does not parse: {message}")
    finally:
        os.chdir(cwd)


def test_tables_are_current():
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "tables.py"), "--check"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is not installed: pip install -e '.[docs]'")
    pytest.importorskip("material", reason="mkdocs-material is not installed: pip install -e '.[docs]'")
    pytest.importorskip("mkdocstrings", reason="mkdocstrings is not installed: pip install -e '.[docs]'")
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or "mkdocs"
    proc = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=REPO,
                          env={**_env(), "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").is_file()
