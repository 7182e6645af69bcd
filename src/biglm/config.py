"""Typed configuration: one mechanism for every subcommand's flags, YAML recipe files and overrides.

It sits at the bottom of the house (it imports nothing of biglm): every `biglm` subcommand, recipe file and the docs'
CLI reference read their options through it. A configuration is a plain dataclass; its fields' types say what a
value may be, and the string literal under a field (an attribute docstring) is its help text::

    @dataclass
    class DecodingConfig:
        steps: int = 10
        \"\"\"model calls T\"\"\"

- One path: ``--field value`` / ``--field=value``, ``--nested.field value`` and dicts read from YAML/JSON all go
  through `from_dict`, which converts each value by its declared type (``6e-4`` is a float for a float field, ``a,b``
  a list for a list field; YAML files are read with a YAML 1.2 float rule) and refuses unknown keys and bad values
  before any work starts, in one line naming the field, the nearest valid name and the accepted type (`ConfigError`;
  `parse_cli` makes it ``PROG: error: ...`` and exit code 2).
- A nested dataclass field can declare named presets (``metadata={"choices": {...}}``): ``--objective mlm`` selects
  one, ``--objective.mlm_ratio 0.2`` changes one of its fields, and a nested dict with ``name`` starts from it.
- A list field marked ``metadata={"repeatable": True}`` takes one item per flag (``--prompt A --prompt B``), never
  split at commas; other list fields take ``a,b``, a YAML list or the flag repeated (`help_type` says which).
  Hyphens and underscores in flag names are the same (``--max-new-tokens`` = ``--max_new_tokens``).
- ``--help`` lists every field with type, default and docstring (`help_rows`); ``--print_config`` prints the
  resolved configuration as YAML, which a later run reads back. A ``device`` field is checked where it enters
  (`check_device`: ``--device cuda`` without a GPU is one line, not a traceback from inside torch).

Why not jsonargparse (litgpt's choice)? Its unknown-key and type errors neither name the nearest valid field nor stay
on one line, and it needs typing patches for our frozen config classes; this module is small and gives those messages.
"""

from __future__ import annotations

import ast
import collections.abc
import dataclasses
import difflib
import functools
import inspect
import re
import sys
import textwrap
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

import yaml

T = TypeVar("T")

__all__ = ["ConfigError", "field_docs", "from_dict", "to_dict", "apply_overrides", "parse_cli", "parse_subcommand",
           "load_yaml", "format_help", "fail", "given_options", "check_device"]


class ConfigError(ValueError):
    """A configuration value or key is wrong; the message names it and what would be accepted."""


# ---------------------------------------------------------------------------------------- introspection
@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a dataclass (and its dataclass bases): field name -> text."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
        for node, nxt in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr)
                    and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if f.init}


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return dataclasses.MISSING


def type_name(tp: Any) -> str:
    """How a type reads in help and errors."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is type(None):
        return "none"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in args)
    if origin is Literal:
        return "{" + "|".join(str(a) for a in args) + "}"
    if origin in (list, tuple, collections.abc.Sequence) and args:
        if origin is tuple and (len(args) != 2 or args[1] is not Ellipsis):
            return f"{len(args)} comma-separated {type_name(args[0])}s"
        return f"comma-separated {type_name(args[0])}s"
    if origin in (dict, collections.abc.Mapping):
        return "comma-separated NAME[=WEIGHT]s or a YAML mapping"
    if dataclasses.is_dataclass(tp):
        return tp.__name__
    return getattr(tp, "__name__", str(tp))


# ---------------------------------------------------------------------------------------- conversion
class _Loader(yaml.SafeLoader):
    """YAML with the YAML 1.2 float rule: ``6e-4`` and ``1e3`` are numbers, as every user expects."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                    |\.[0-9_]+(?:[eE][-+][0-9]+)?
                    |[-+]?\.(?:inf|Inf|INF)
                    |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."),
)


def load_yaml(path: str | Path) -> Any:
    """A YAML or JSON file, numbers like ``6e-4`` read as floats."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} not found")
    try:
        return yaml.load(path.read_text(), Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {str(e).splitlines()[0]}") from None


def _bad(name: str, value: Any, tp: Any, extra: str = "") -> ConfigError:
    return ConfigError(f"--{name} expects {type_name(tp)}, got {value!r}{extra}")


def _split(value: str) -> list[str]:
    value = value.strip()
    if value.startswith("["):
        loaded = yaml.load(value, Loader=_Loader)
        return [str(v) if not isinstance(v, (int, float)) else v for v in loaded]
    return [v.strip() for v in value.split(",") if v.strip()]


def convert(value: Any, tp: Any, *, name: str, current: Any = None, choices: dict | None = None) -> Any:
    """``value`` (a string from the command line, or a YAML value) as type ``tp``, or a `ConfigError`."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if type(None) in args and (value is None or (isinstance(value, str) and value.lower() in {"none", "null", ""})):
            return None
        for arm in args:
            if arm is type(None):
                continue
            try:
                return convert(value, arm, name=name, current=current, choices=choices)
            except ConfigError:
                pass
        raise _bad(name, value, tp)
    if origin is Literal:
        for choice in args:
            if value == choice or (isinstance(value, str) and str(choice) == value):
                return choice
        close = difflib.get_close_matches(str(value), [str(a) for a in args], n=1)
        raise _bad(name, value, tp, f"; did you mean {close[0]!r}?" if close else "")
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in {"true", "yes", "on", "1", "false", "no", "off", "0"}:
            return value.lower() in {"true", "yes", "on", "1"}
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise _bad(name, value, tp)
    if tp is int:
        if isinstance(value, bool):
            raise _bad(name, value, tp)
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.replace("_", ""))
            except ValueError:
                try:
                    f = float(value)
                except ValueError:
                    raise _bad(name, value, tp) from None
                if f.is_integer():
                    return int(f)
        raise _bad(name, value, tp, " (a whole number)")
    if tp is float:
        if isinstance(value, bool):
            raise _bad(name, value, tp)
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise _bad(name, value, tp)
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise _bad(name, value, tp)
    if tp is Path:
        return Path(value)
    if origin in (list, tuple, collections.abc.Sequence):  # an abstract Sequence[...] is read as a list
        items = _split(value) if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)):
            raise _bad(name, value, tp)
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            if len(items) != len(args):
                raise _bad(name, value, tp, f" ({len(items)} values)")
            return tuple(convert(v, a, name=name) for v, a in zip(items, args))
        inner = args[0] if args else Any
        out = [convert(v, inner, name=name) for v in items]
        return tuple(out) if origin is tuple else out
    if origin in (dict, collections.abc.Mapping):
        key_t, val_t = args or (Any, Any)
        if isinstance(value, str):
            if value.strip().startswith("{"):
                value = yaml.load(value, Loader=_Loader)
            else:
                pairs = {}
                for item in _split(value):
                    key, _, weight = str(item).partition("=")
                    pairs[key] = weight if weight else 1.0
                value = pairs
        if not isinstance(value, dict):
            raise _bad(name, value, tp)
        return {convert(k, key_t, name=name): convert(v, val_t, name=f"{name}[{k}]") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if isinstance(value, str):
            if choices and value in choices:
                return choices[value]
            close = difflib.get_close_matches(value, list(choices or ()), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"--{name} expects one of {{{'|'.join(choices or ())}}}, got {value!r}{hint}")
        if isinstance(value, dict):
            return from_dict(tp, value, base=current, prefix=f"{name}.", choices=choices)
        raise _bad(name, value, tp)
    return value


# ---------------------------------------------------------------------------------------- dict <-> config
def _unknown(key: str, cls: type, prefix: str) -> ConfigError:
    known = list(_fields(cls))
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if close:
        hint = f"; did you mean --{prefix}{close[0]} ({type_name(_hints(cls)[close[0]])})?"
    else:
        hint = f"; see --help for the {len(known)} options"
    return ConfigError(f"unknown option --{prefix}{key}{hint}")


def from_dict(cls: type[T], data: dict[str, Any], *, base: T | None = None, prefix: str = "",
              choices: dict | None = None) -> T:
    """Build ``cls`` from ``data`` (starting from ``base``'s values when given), every value converted
    and checked; unknown keys, bad values and the class's own validation become `ConfigError`."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or cls.__name__} must be a mapping of options, got {data!r}")
    fields, hints = _fields(cls), _hints(cls)
    data = {str(k).replace("-", "_"): v for k, v in data.items()}
    if choices and "name" in data and "name" in fields:  # a named preset, then its fields changed
        base = convert(data["name"], cls, name=prefix.rstrip("."), choices=choices)
    values: dict[str, Any] = {}
    for key, raw in data.items():
        if key not in fields:
            raise _unknown(key, cls, prefix)
        f = fields[key]
        current = getattr(base, key) if base is not None else _default(f)
        current = None if current is dataclasses.MISSING else current
        if f.metadata.get("repeatable") and isinstance(raw, str):  # one item per flag, commas kept
            raw = [raw]
        values[key] = convert(raw, hints[key], name=prefix + key, current=current, choices=f.metadata.get("choices"))
    missing = [n for n, f in fields.items() if n not in values and _default(f) is dataclasses.MISSING and base is None]
    if missing:
        raise ConfigError(f"missing required option --{prefix}{missing[0]} ({type_name(hints[missing[0]])})")
    try:
        return dataclasses.replace(base, **values) if base is not None else cls(**values)
    except (ValueError, TypeError, KeyError) as e:
        if isinstance(e, ConfigError):
            raise
        where = f"--{prefix.rstrip('.')}: " if prefix else ""
        raise ConfigError(f"{where}{e}") from None


def to_dict(obj: Any) -> Any:
    """A config as plain YAML/JSON data (tuples as lists, paths as strings), readable by `from_dict`."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): to_dict(v) for k, v in obj.items()}
    if isinstance(obj, Path):
        return str(obj)
    return obj


def _split_flags(argv: list[str], cls: type) -> tuple[list[str], dict[str, Any]]:
    """Leading positionals and a nested dict of ``--a.b value`` flags (bools may omit the value)."""
    positionals: list[str] = []
    nested: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--") or arg == "--":
            if nested:
                raise ConfigError(f"unexpected argument {arg!r} after the options: put positional arguments first, "
                                  "and give every --option a value")
            positionals.append(arg)
            i += 1
            continue
        key = arg[2:]
        if "=" in key:
            key, raw = key.split("=", 1)
            i += 1
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--") and not _is_bool(cls, key):
            raw, i = argv[i + 1], i + 2
        elif _is_bool(cls, key):
            if i + 1 < len(argv) and argv[i + 1].lower() in {"true", "false", "yes", "no", "on", "off", "1", "0"}:
                raw, i = argv[i + 1], i + 2
            else:
                raw, i = "true", i + 1
        elif _field_type(cls, key) is None:
            raw, i = "", i + 1  # an unknown flag: `from_dict` names it and the nearest valid one
        else:
            raise ConfigError(f"--{key} needs a value")
        node = nested
        parts = key.replace("-", "_").split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if isinstance(child, str):  # `--objective mlm --objective.alpha ...`
                child = {"name": child}
            node[part] = child = child if isinstance(child, dict) else {}
            node = child
        last = parts[-1]
        if isinstance(node.get(last), dict) and isinstance(raw, str):  # `--objective.alpha x --objective mlm`
            node[last]["name"] = raw
        elif last in node:  # a repeated flag: every value is kept (a list field takes them all)
            node[last] = (node[last] if isinstance(node[last], _Repeated) else _Repeated([node[last]])) + [raw]
        else:
            node[last] = raw
    return positionals, nested


class _Repeated(list):
    """The values of a flag given several times."""

    def __add__(self, other: list) -> "_Repeated":
        return _Repeated(list(self) + list(other))


def _field_type(cls: type, key: str) -> Any:
    """The declared type of flag ``key`` (``a.b`` for nested fields), None when no such field exists."""
    tp: Any = cls
    for part in key.replace("-", "_").split("."):
        if not dataclasses.is_dataclass(tp) or part not in _fields(tp):
            return None
        tp = _hints(tp)[part]
    return tp


def _is_bool(cls: type, key: str) -> bool:
    tp = _field_type(cls, key)
    return tp is bool or (get_origin(tp) in (typing.Union, types.UnionType) and bool in get_args(tp))


def apply_overrides(obj: T, argv: list[str]) -> T:
    """``obj`` with ``--field value`` flags applied (no positionals allowed)."""
    positionals, nested = _split_flags(argv, type(obj))
    if positionals:
        raise ConfigError(f"unexpected argument {positionals[0]!r}: options are written --field value")
    return from_dict(type(obj), nested, base=obj) if nested else obj


def given_options(cls: type, argv: list[str]) -> dict[str, Any]:
    """The options a command line names explicitly, as a nested dict of their raw values (``--a.b 1`` ->
    ``{"a": {"b": "1"}}``); positionals and ``--print_config`` are left out. For settings whose defaults come
    from somewhere else (a model's saved decoding settings) that only an explicit flag overrides."""
    argv = [a for a in argv if a not in {"--print_config", "--print-config"}]
    return _split_flags(argv, cls)[1]


# ---------------------------------------------------------------------------------------- the command line
def _flat_fields(cls: type, prefix: str = "") -> list[tuple[str, Any, Any, str, dict | None, bool]]:
    rows = []
    docs, hints = field_docs(cls), _hints(cls)
    for name, f in _fields(cls).items():
        tp, default = hints[name], _default(f)
        choices = f.metadata.get("choices")
        rows.append((prefix + name, tp, default, docs.get(name, ""), choices, bool(f.metadata.get("repeatable"))))
        if dataclasses.is_dataclass(tp):
            rows += _flat_fields(tp, prefix + name + ".")
    return rows


def help_type(tp: Any, *, flag: str, repeatable: bool = False, positional: bool = False) -> str:
    """How ``--help`` says a field's value is given: its type (`type_name`), and for a list how a list really is
    written on the command line: one item per flag for a ``repeatable`` field (commas kept), else ``a,b``, a YAML
    list or the flag repeated; a list positional takes the arguments that are left."""
    origin, args = get_origin(tp), get_args(tp)
    is_list = origin in (list, collections.abc.Sequence) or (origin is tuple and len(args) == 2 and args[1] is Ellipsis)
    if not is_list:
        return type_name(tp)
    item = type_name(args[0]) if args else "value"
    if positional:
        return f"{item}s: the arguments left, each also split at commas"
    if repeatable:
        return f"a {item} per {flag}: {flag} A {flag} B; commas kept"
    return f"{item}s: a,b or [a, b] or {flag} A {flag} B"


def help_rows(cls: type, *, positionals: tuple[str, ...] = (), base: Any = None) -> list[tuple[str, str, str, str, bool]]:
    """Every option of ``cls`` as help shows it: ``(name, kind, default shown, help text, positional)``, defaults read
    from ``base`` where given (a recipe's values); `format_help` and the documentation's CLI reference both read it."""
    rows = []
    for name, tp, default, text, choices, repeatable in _flat_fields(cls):
        if base is not None:
            try:
                value: Any = base
                for part in name.split("."):
                    value = getattr(value, part)
                default = value
            except AttributeError:
                pass
        if dataclasses.is_dataclass(tp) and not choices:
            continue  # a plain nested group: its fields are listed as --name.field
        positional = name.split(".")[0] in positionals
        kind = (help_type(tp, flag=f"--{name}", repeatable=repeatable, positional=positional) if not choices
                else "{" + "|".join(choices) + "}")
        if dataclasses.is_dataclass(default) and not isinstance(default, type):
            shown = getattr(default, "name", type(default).__name__)
        else:
            shown = "required" if default is dataclasses.MISSING else repr(to_dict(default))
        rows.append((name, kind, shown, text, positional))
    return rows


def format_help(cls: type, *, prog: str, doc: str | None, positionals: tuple[str, ...] = (),
                base: Any = None) -> str:
    """``--help`` text: the command's docstring, then every option with type, default and meaning."""
    pos = " ".join(p.upper() for p in positionals)
    lines = [f"usage: {prog} {pos + ' ' if pos else ''}[--OPTION VALUE ...] [--print_config] [--help]", ""]
    if doc:
        lines += [inspect.cleandoc(doc), ""]
    lines.append("options (fields of " + cls.__name__ + "; --a.b sets field b of a):")
    for name, kind, shown, text, positional in help_rows(cls, positionals=positionals, base=base):
        flag = name if not positional else name.upper()
        lines.append(f"  --{flag} ({kind}, default {shown})" if flag == name else f"  {flag} ({kind})")
        if text:
            lines.append(f"      {text}")
    return "\n".join(lines) + "\n"


def parse_cli(cls: type[T], argv: list[str], *, prog: str, doc: str | None = None,
              positionals: tuple[str, ...] = (), base: T | None = None) -> T:
    """Parse a command line into ``cls``: leading positionals fill ``positionals`` in order, then
    ``--field value`` flags. ``--help`` prints `format_help` and ``--print_config`` the resolved
    config as YAML (both exit 0); any error prints one line and exits with code 2."""
    if any(a in {"-h", "--help"} for a in argv):
        print(format_help(cls, prog=prog, doc=doc, positionals=positionals, base=base))
        raise SystemExit(0)
    show = any(a in {"--print_config", "--print-config"} for a in argv)
    argv = [a for a in argv if a not in {"--print_config", "--print-config"}]
    try:
        pos, nested = _split_flags(argv, cls)
        takes_rest = bool(positionals) and get_origin(_hints(cls)[positionals[-1]]) is list
        if len(pos) > len(positionals) and not takes_rest:
            raise ConfigError(f"unexpected argument {pos[len(positionals)]!r}"
                              + (f" (takes {', '.join(p.upper() for p in positionals)})" if positionals else ""))
        if pos and positionals and get_origin(_hints(cls)[positionals[-1]]) is list and len(pos) >= len(positionals):
            k = len(positionals) - 1  # the last positional is a list: it takes the rest (e.g. SOURCE...), each
            pos = pos[:k] + [[x for p in pos[k:] for x in p.split(",") if x]]  # comma-separated as its flag is
        for name, value in zip(positionals, pos):
            if name in nested:
                raise ConfigError(f"{name.upper()} given twice: as an argument and as --{name}")
            nested[name] = value
        missing = [p for p in positionals if p not in nested and base is None
                   and _default(_fields(cls)[p]) is dataclasses.MISSING]
        if missing:
            raise ConfigError(f"missing {missing[0].upper()}: usage: {prog} {' '.join(p.upper() for p in positionals)} "
                              "[--OPTION VALUE ...]")
        cfg = from_dict(cls, nested, base=base)
        if "device" in _fields(cls):
            check_device(getattr(cfg, "device"))
    except ConfigError as e:
        fail(prog, str(e))
    if show:
        print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
        raise SystemExit(0)
    return cfg


def parse_subcommand(argv: list[str], commands: dict[str, tuple[type, str, tuple[str, ...]]], *, prog: str
                     ) -> tuple[str, Any]:
    """``PROG SUB [args]`` with ``commands = {SUB: (config class, doc, positionals)}``: the chosen name and its
    parsed config (see `parse_cli`)."""
    names = " | ".join(commands)
    if not argv or argv[0] in {"-h", "--help"}:
        lines = [f"usage: {prog} {{{names}}} ...", ""]
        lines += [f"  {n:<10} {textwrap.dedent(doc).strip().splitlines()[0]}" for n, (_, doc, _) in commands.items()]
        print("\n".join(lines) + f"\n\nRun `{prog} COMMAND --help` for a command's options.")
        raise SystemExit(0 if argv else 2)
    if argv[0] not in commands:
        close = difflib.get_close_matches(argv[0], list(commands), n=1)
        fail(prog, f"unknown command {argv[0]!r}" + (f"; did you mean {close[0]!r}?" if close else f"; choose {names}"))
    cls, doc, positionals = commands[argv[0]]
    return argv[0], parse_cli(cls, argv[1:], prog=f"{prog} {argv[0]}", doc=doc, positionals=positionals)


_DEVICE = re.compile(r"^(cpu|auto|mps|cuda)(:(\d+))?$")


def check_device(device: str | None, *, flag: str = "--device") -> None:
    """Refuse a device this machine lacks, in one line, where the config enters: ``cuda`` (or ``cuda:N``) with no
    GPU (or fewer than N + 1) visible, or a name torch does not know. torch would say the same much later, inside
    a traceback. ``None`` and ``auto`` (the command picks) and ``cpu`` pass without importing torch."""
    if device is None or device in {"auto", "cpu"}:
        return
    m = _DEVICE.match(str(device))
    if m is None:
        raise ConfigError(f"{flag} {device!r} is not a device: use cpu, cuda or cuda:N")
    import torch  # deferred: only a GPU request pays for it

    if m.group(1) == "mps":
        if not torch.backends.mps.is_available():
            raise ConfigError(f"{flag} {device}: no Apple GPU (MPS) on this machine; use {flag} cpu")
        return
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise ConfigError(f"{flag} {device}: no CUDA GPU is visible on this machine; use {flag} cpu")
    if m.group(3) is not None and int(m.group(3)) >= count:
        raise ConfigError(f"{flag} {device}: this machine has {count} visible CUDA GPU(s), cuda:0..cuda:{count - 1}")


def fail(prog: str, message: str) -> typing.NoReturn:
    """Print ``PROG: error: MESSAGE`` and exit with code 2 (bad usage), as argparse does."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(2)
