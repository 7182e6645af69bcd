"""The rules of the house (docs/HOUSE.md), read from the source: every room imports only what the map's "may import"
column names (the table is parsed from docs/HOUSE.md, so map and test cannot drift), the import graph between
rooms has no cycle, third-party frameworks are imported only in the integrations room, and process groups are
started and torn down in one module. Static: every import counts, also one inside a function (a lazy import is
still a dependency)."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "biglm"
HOUSE = SRC.parents[1] / "docs" / "HOUSE.md"
# what a room may import of the package's own __init__ (HOUSE.md: the adapters the core reaches by name)
PACKAGE_NAMES = {"biglm.adapter", "biglm.ADAPTERS"}


def _module(path: Path, src: Path = SRC) -> str:
    parts = list(path.relative_to(src.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(src: Path = SRC) -> dict[str, set[str]]:
    """module -> every module or package it imports, biglm's resolved to absolute names; ``from P import n`` counts
    as ``P.n`` (a submodule, or a name defined in P: ``from biglm import serving`` is an import of a room)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for path in src.rglob("*.py"):
        name = _module(path, src)
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = ".".join(package[:len(package) - node.level + 1]) if node.level else ""
                module = ".".join(p for p in (base, node.module) if p)
                targets = [f"{module}.{alias.name}" for alias in node.names if alias.name != "*"] or [module]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            graph[name].update(targets)
    return graph


GRAPH = _imports()


def room(module: str, src: Path = SRC) -> str:
    """The room of a module: ``biglm.training.loop`` -> ``training``; a top-level module is its own room
    (``biglm.config`` -> ``config``); a name of the package's ``__init__`` (``biglm.adapter``) -> ``biglm``."""
    parts = module.split(".")
    if len(parts) > 1 and ((src / parts[1] / "__init__.py").is_file() or (src / f"{parts[1]}.py").is_file()):
        return parts[1]
    return "biglm"


def is_entry_point(module: str) -> bool:
    """A subcommand's module (``cli*``) or the package's own entry: they stand above every room."""
    last = module.split(".")[-1]
    return last.startswith("cli") or module in {"biglm", "biglm.__main__", "biglm.cli", "biglm.cli_presets"}


def rooms_in_source(src: Path = SRC) -> set[str]:
    """The rooms the source holds: every package under ``src`` and every top-level module that is no entry point."""
    packages = {p.parent.name for p in src.glob("*/__init__.py")}
    return packages | {p.stem for p in src.glob("*.py") if not is_entry_point(_module(p, src))}


def may_import_table(text: str) -> dict[str, set[str] | None]:
    """HOUSE.md's map as rules: room -> the rooms or modules (``objective.loss``) its "may import" cell names in
    backticks, outside parentheses. "nothing" is the empty set; "anything in biglm but `X`" every room but those
    named (as ``{"!X"}``; None: every room, no exception named)."""
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    table: dict[str, set[str] | None] = {}
    for line in rows:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name = cells[0].strip("`").rstrip("/").removesuffix(".py")
        named = set(re.findall(r"`([^`]+)`", re.sub(r"\([^)]*\)", "", cells[-1])))  # (a remark names nothing)
        if cells[-1].startswith("nothing"):
            assert not named, f"HOUSE.md: {name}'s 'nothing' names {named}"
            table[name] = set()
        elif cells[-1].startswith("anything"):
            table[name] = {f"!{n}" for n in named} or None
        else:
            table[name] = named
    return table


TABLE = may_import_table(HOUSE.read_text())


def allowed(table: dict[str, set[str] | None], source: str, target: str, src: Path = SRC) -> bool:
    """Whether room ``source`` may import module ``target`` (a biglm module of another room) under ``table``."""
    if target in PACKAGE_NAMES:
        return True
    rule, target_room = table.get(source, set()), room(target, src)
    if rule is None:
        return True
    if any(r.startswith("!") for r in rule):  # "anything but ..."
        return f"!{target_room}" not in rule
    return any(target_room == r or target == f"biglm.{r}" or target.startswith(f"biglm.{r}.") for r in rule)


def violations(graph: dict[str, set[str]], table: dict[str, set[str] | None], src: Path = SRC) -> list[str]:
    """Every import the map does not allow, as "ROOM/ imports TARGET (MODULE)" (entry points may import anything)."""
    out = []
    for module, targets in sorted(graph.items()):
        if is_entry_point(module):
            continue
        source = room(module, src)
        for target in sorted(targets):
            if (target.startswith("biglm.") and room(target, src) != source
                    and not allowed(table, source, target, src)):
                out.append(f"{source}/ imports {target} ({module})")
    return out


def room_edges() -> dict[str, dict[str, list[str]]]:
    """room -> room it imports -> the importing modules (entry points left out: they may import any room)."""
    edges: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for module, targets in GRAPH.items():
        if is_entry_point(module):
            continue
        for target in targets:
            if target.startswith("biglm.") and room(target) not in {room(module), "biglm"}:
                edges[room(module)][room(target)].append(module)
    return edges


def test_the_source_tree_is_read():
    assert len(GRAPH) > 80 and "biglm.training.loop" in GRAPH  # a guard: a wrong path would pass every rule


def test_the_map_has_a_row_for_every_room_and_names_only_real_ones():
    """Every room of the source has a row (a new room is placed on the map before it passes), and every room or
    module a row names exists (a typo would allow nothing, or hide a rule)."""
    rooms = rooms_in_source()
    assert {"objective", "model", "config", "serving", "integrations"} <= set(TABLE)  # the table was parsed
    assert set(TABLE) == rooms, (f"rooms without a row in docs/HOUSE.md: {sorted(rooms - set(TABLE))}; "
                                 f"rows without a room: {sorted(set(TABLE) - rooms)}")
    for name, rule in TABLE.items():
        for target in {r.lstrip("!") for r in rule or ()}:
            first, *rest = target.split(".")
            assert first in rooms and (not rest or (SRC / first / f"{rest[0]}.py").is_file()), (name, target)
    assert all(f"`{n}`" in HOUSE.read_text() for n in PACKAGE_NAMES)  # the package names a room may import


def test_every_room_imports_only_what_the_map_allows():
    bad = violations(GRAPH, TABLE)
    assert not bad, "imports docs/HOUSE.md's 'may import' column does not allow:\n" + "\n".join(bad)


def test_the_map_check_reports_a_forbidden_import(tmp_path):
    """The check can fail: a synthetic source tree whose serving imports the model, data the objective, generation
    data and the model objective.masking (one eagerly, the others lazily or from the package) is reported, edge by
    edge; an entry point, the adapters by name and the model's one loss are not."""
    src = tmp_path / "biglm"
    files = {
        "__init__.py": "def adapter(name): ...\n",
        "objective/__init__.py": "", "objective/loss.py": "", "objective/masking.py": "",
        "model/__init__.py": "",
        "model/modeling.py": "from ..objective.loss import x\nfrom ..objective import masking\n",
        "data/__init__.py": "", "data/prepare.py": "def f():\n    from biglm.objective.masking import mask\n",
        "generation/__init__.py": "", "generation/batch.py": "from biglm import data\nfrom .. import adapter\n",
        "serving/__init__.py": "", "serving/app.py": "import biglm.model.modeling\n",
        "serving/cli.py": "from ..model import modeling\n",
    }
    for name, text in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    found = violations(_imports(src), TABLE, src)
    assert found == ["data/ imports biglm.objective.masking.mask (biglm.data.prepare)",
                     "generation/ imports biglm.data (biglm.generation.batch)",
                     "model/ imports biglm.objective.masking (biglm.model.modeling)",
                     "serving/ imports biglm.model.modeling (biglm.serving.app)"], found
    table = "| `a/` | x | nothing |\n| `b/` | y | `a`, `c.d` only (not `f`) |\n| `e/` | z | anything but `a` |"
    assert may_import_table(table) == {"a": set(), "b": {"a", "c.d"}, "e": {"!a"}}


def test_no_cycle_between_rooms():
    edges = room_edges()
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in edges.get(node, {}):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt] if nxt in path else path + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for start in list(edges):
        if start not in state:
            visit(start, [start])
    detail = {f"{a} -> {b}": edges[a][b] for cycle in cycles for a, b in zip(cycle, cycle[1:])}
    assert not cycles, f"rooms import each other in a cycle: {cycles}; edges: {detail}"


def test_nothing_imports_report():
    users = {m for m, ts in GRAPH.items() for t in ts
             if room(t) == "report" and room(m) != "report" and t.startswith("biglm.")}
    assert users == set(), users


def test_only_entry_points_import_integrations():
    users = {m for m, ts in GRAPH.items() for t in ts if t.startswith("biglm.integrations")
             and room(m) != "integrations" and not is_entry_point(m)}
    assert users == set(), f"core modules import the integrations room: {sorted(users)}"


# (framework, module) pairs HOUSE.md names as exceptions: the package registers the QA task name at import
FRAMEWORK_EXCEPTIONS = {("transformers.pipelines", "biglm")}


@pytest.mark.parametrize("framework", ["lm_eval", "ray", "sentence_transformers", "transformers.pipelines"])
def test_frameworks_are_imported_only_in_integrations(framework):
    users = {m for m, ts in GRAPH.items() for t in ts
             if (t == framework or t.startswith(framework + ".")) and room(m) != "integrations"
             and (framework, m) not in FRAMEWORK_EXCEPTIONS}
    assert users == set(), f"{framework} imported outside integrations/: {sorted(users)}"


def test_process_groups_live_in_one_module():
    calls = {"init_process_group", "destroy_process_group", "new_group"}
    users = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
            if name in calls:
                users.add(_module(path))
    assert users == {"biglm.training.distributed"}, users


def test_one_ignore_index():
    defined = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "IGNORE_INDEX"
                                                    for t in node.targets):
                defined.add(_module(path))
    assert defined == {"biglm.objective.loss"}, defined


def test_no_design_note_references():
    """The design notes are not in this repository: code keeps its reasoning in words, not in section numbers."""
    hits = [f"{p.relative_to(SRC)}:{i}" for p in SRC.rglob("*.py")
            for i, line in enumerate(p.read_text().splitlines(), 1) if "DESIGN §" in line or "DESIGN.md" in line]
    assert hits == [], hits


def test_every_listed_task_builds(capsys):
    """`biglm tasks` lists the registry; every task there builds from its defaults (or, where the defaults name no
    data, refuses in one line naming the --task. setting to give), its loop settings are real FinetuneConfig fields,
    and every family module of the wing is listed (a module left out would drop its tasks silently)."""
    from biglm.cli import main
    from biglm.config import ConfigError, from_dict
    from biglm.finetune import FinetuneConfig, tasks
    from biglm.finetune.task import FinetuneTask
    from biglm.finetune.templates import TemplateError

    assert main(["tasks"]) == 0
    listed = capsys.readouterr().out
    assert tasks.TASKS and all(name in listed for name in tasks.TASKS)
    for name, recipe in tasks.TASKS.items():
        from_dict(FinetuneConfig, dict(recipe.loop))  # unknown or mistyped loop settings raise here
        try:
            task = recipe.build(recipe.settings())
        except (ConfigError, TemplateError) as e:
            assert "--task." in str(e), (name, str(e))
            continue
        assert isinstance(task, FinetuneTask) and task.name == name and isinstance(task.metric, str), name
    import importlib

    with_recipes = {p.stem for p in (SRC / "finetune" / "tasks").glob("*.py") if p.stem != "__init__"
                    and hasattr(importlib.import_module(f"biglm.finetune.tasks.{p.stem}"), "RECIPES")}
    assert with_recipes == {m.__name__.rsplit(".", 1)[-1] for m in tasks.FAMILIES}, with_recipes
