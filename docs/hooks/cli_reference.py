"""mkdocs hook: the CLI reference page (``reference/cli.md``), generated at build time from the typed configs.

Every ``biglm`` subcommand parses its options with `biglm.config` (`parse_cli` / `parse_subcommand`), and its
``--help`` is `biglm.config.format_help` over the command's config dataclass. This hook runs each command's
``--help`` in-process with `format_help` wrapped, so it learns which dataclass (and which defaults: a recipe's
``base``) each command parses, then writes every option with its type, default and help (`field_docs`: the
attribute docstring under each field). The commands come from `biglm.cli.COMMANDS`, the subcommands from the
usage line `parse_subcommand` prints, the fine-tuning tasks from `biglm.finetune.tasks.TASKS`. Nothing is copied:
a field added to a config appears here at the next build.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import re
import sys
from typing import Any

PAGE = "reference/cli.md"


def _escape(text: str) -> str:
    """Markdown-safe prose: outside code spans ``<`` and ``>`` are escaped (help names ``<mask>`` tokens) and so is
    ``][`` (``hf:OWNER/NAME[:CONFIG][@SPLIT]`` is no reference link)."""
    parts = re.split(r"(``.+?``|`[^`\n]+`)", text)
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("][", "]\\[")
    return "".join(parts)


def _code(value: str) -> str:
    """``value`` as one inline code span, whatever backticks it holds."""
    ticks = "``" if "`" in value else "`"
    return f"{ticks} {value} {ticks}" if ticks == "``" else f"`{value}`"


def _doc_markdown(doc: str | None) -> list[str]:
    import inspect

    if not doc:
        return []
    text = inspect.cleandoc(doc)
    out: list[str] = []
    for line in text.splitlines():
        stripped = line.rstrip()
        if stripped.endswith("::"):  # an RST literal block marker: the indented lines after it are code
            stripped = stripped[:-1]
        out.append(stripped if line.startswith("    ") else _escape(stripped))
    return out + [""]


def _options(cls: type, positionals: tuple[str, ...], base: Any) -> list[str]:
    from biglm.config import help_rows

    lines = []
    for name, kind, shown, text, positional in help_rows(cls, positionals=positionals, base=base):
        if positional:
            head = f"- **`{name.upper()}`** ({_escape(kind)}, positional)"
        else:
            head = f"- **`--{name}`** ({_escape(kind)}; default {_code(shown)})"
        lines.append(head + (f": {_escape(text)}" if text else ""))
    return lines


class _Recorder:
    """Wraps `biglm.config.format_help` wherever a loaded biglm module holds it; records each call's arguments."""

    def __init__(self) -> None:
        import biglm.config as config

        self.original = config.format_help
        self.calls: list[dict[str, Any]] = []

    def __call__(self, cls: type, *, prog: str, doc: str | None, positionals: tuple[str, ...] = (),
                 base: Any = None) -> str:
        self.calls.append({"cls": cls, "prog": prog, "doc": doc, "positionals": positionals, "base": base})
        return self.original(cls, prog=prog, doc=doc, positionals=positionals, base=base)

    def install(self) -> None:
        for name, module in list(sys.modules.items()):
            if (name == "biglm" or name.startswith("biglm.")) and getattr(module, "format_help", None) is self.original:
                module.format_help = self  # type: ignore[attr-defined]

    def remove(self) -> None:
        for name, module in list(sys.modules.items()):
            if (name == "biglm" or name.startswith("biglm.")) and getattr(module, "format_help", None) is self:
                module.format_help = self.original  # type: ignore[attr-defined]


def _help(recorder: _Recorder, module: Any, argv: list[str]) -> tuple[list[dict[str, Any]], str]:
    """Run ``module.main(argv)`` (a ``--help``), returning the format_help calls it made and what it printed."""
    recorder.calls = []
    recorder.install()
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            try:
                module.main(argv)
            except SystemExit:
                pass
    finally:
        recorder.remove()
    return list(recorder.calls), out.getvalue()


def _section(level: str, title: str, call: dict[str, Any]) -> list[str]:
    pos = " ".join(p.upper() for p in call["positionals"])
    usage = f"{call['prog']} {pos + ' ' if pos else ''}[--OPTION VALUE ...]"
    lines = [f"{level} `{title}`", "", "```text", usage, "```", ""]
    lines += _doc_markdown(call["doc"])
    options = _options(call["cls"], call["positionals"], call["base"])
    lines += ([f"Options (fields of `{call['cls'].__module__}.{call['cls'].__qualname__}`; `--a.b` sets field `b` "
               "of `a`):", ""] + options if options else ["No options."]) + [""]
    return lines


def cli_reference() -> str:
    """The whole page, as Markdown."""
    from biglm.cli import COMMANDS

    recorder = _Recorder()
    lines = ["# CLI reference", "",
             "Generated at build time from the typed configuration dataclasses each command parses (`biglm.config`): "
             "every option with its type, default and help, exactly what `biglm COMMAND --help` prints. Options are "
             "typed: an unknown name or a wrong type is refused before any work starts, with the nearest valid name. "
             "Hyphens and underscores in option names are the same (`--max-new-tokens` is `--max_new_tokens`).", "",
             "| command | what it does |", "|---|---|"]
    lines += [f"| [`biglm {name}`](#biglm-{name}) | {_escape(help_)} |" for name, (_, help_) in COMMANDS.items()]
    lines.append("")
    for name, (module_name, help_) in COMMANDS.items():
        module = importlib.import_module(module_name)
        calls, printed = _help(recorder, module, ["--help"])
        lines += [f"## `biglm {name}` {{#biglm-{name}}}", "", _escape(help_) + ".", ""]
        if calls:
            call = calls[0]
            lines += _section("###", f"biglm {name}", call)[2:]  # the command's own heading is above
        subs = re.search(r"usage: \S+ \S+ \{([^}]*)\}", printed)
        if not calls and subs:
            for sub in [s.strip() for s in subs.group(1).split("|")]:
                sub_calls, _ = _help(recorder, module, [sub, "--help"])
                if sub_calls:
                    lines += _section("###", f"biglm {name} {sub}", sub_calls[0])
        if name == "finetune":
            from biglm.finetune.tasks import TASKS

            lines += ["### Task settings", "",
                      "Each task's own settings are `--task.FIELD` options (`biglm finetune TASK --help`).", ""]
            for task in TASKS:
                task_calls, _ = _help(recorder, module, [task, "--help"])
                for call in task_calls[1:]:  # the first is the loop's options, listed above
                    lines += _section("####", f"biglm finetune {task}", call)
    return "\n".join(lines).rstrip() + "\n"


def on_files(files, config):  # mkdocs event: add the generated page before the nav is built
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=cli_reference()))
    return files


if __name__ == "__main__":  # print the page: python docs/hooks/cli_reference.py
    print(cli_reference())
