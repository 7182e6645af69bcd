"""The rules of the house (docs/HOUSE.md), read from the source: the import graph of ``src/biglm`` between rooms
has no cycle, the forbidden edges are absent, third-party frameworks are imported only in the integrations room,
and process groups are started and torn down in one module. Static: every import counts, also one inside a
function (a lazy import is still a dependency)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "biglm"


def _module(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """module -> every module or package it imports (biglm's resolved to absolute names; others by top name)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for path in SRC.rglob("*.py"):
        name = _module(path)
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(package[:len(package) - node.level + 1])
                    targets = ([f"{base}.{node.module}"] if node.module
                               else [f"{base}.{alias.name}" for alias in node.names])
                else:
                    targets = [node.module or ""]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            graph[name].update(targets)
    return graph


GRAPH = _imports()


def room(module: str) -> str:
    """The room of a module: ``biglm.training.loop`` -> ``training``; top-level modules are their own room."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "biglm"


def is_entry_point(module: str) -> bool:
    """A subcommand's module (``cli*``) or the package's own entry: they stand above every room."""
    last = module.split(".")[-1]
    return last.startswith("cli") or module in {"biglm", "biglm.__main__", "biglm.cli", "biglm.cli_presets"}


def room_edges() -> dict[str, dict[str, list[str]]]:
    """room -> room it imports -> the importing modules (entry points left out: they may import any room)."""
    edges: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for module, targets in GRAPH.items():
        if is_entry_point(module):
            continue
        for target in targets:
            if target.startswith("biglm.") and room(target) != room(module):
                edges[room(module)][room(target)].append(module)
    return edges


def test_the_source_tree_is_read():
    assert len(GRAPH) > 80 and "biglm.training.loop" in GRAPH  # a guard: a wrong path would pass every rule


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


# (room, rooms it must not import): the layers, bottom up
FORBIDDEN = {
    "model": {"data", "checkpoint", "generation", "scoring", "training", "finetune", "serving", "report",
              "integrations", "config"},
    "objective": {"model", "data", "checkpoint", "generation", "scoring", "training", "finetune", "serving", "report",
                  "integrations"},
    "data": {"model", "checkpoint", "generation", "scoring", "training", "finetune", "serving", "report",
             "integrations"},
    "checkpoint": {"generation", "scoring", "training", "finetune", "serving", "report", "integrations"},
    "generation": {"training", "finetune", "scoring", "serving", "report", "integrations"},
    "scoring": {"training", "finetune", "serving", "report", "integrations"},
    "serving": {"training", "finetune", "scoring", "report", "integrations"},
    "report": {"training", "finetune", "generation", "serving", "integrations"},
    "training": {"finetune", "serving", "report", "integrations"},
    "finetune": {"serving", "report", "integrations"},
    "integrations": {"report"},
}


@pytest.mark.parametrize("source", sorted(FORBIDDEN))
def test_forbidden_edges(source):
    edges = room_edges().get(source, {})
    bad = {target: modules for target, modules in edges.items() if target in FORBIDDEN[source]}
    assert not bad, f"{source}/ imports {sorted(bad)}: {bad}"


def test_model_imports_only_the_one_loss():
    """The model's Hugging Face ``labels`` path calls the objective's loss; nothing else of biglm is imported."""
    outside = {t for m, ts in GRAPH.items() if room(m) == "model" for t in ts
               if t.startswith("biglm.") and room(t) != "model"}
    assert outside <= {"biglm.objective.loss"}, outside


def test_nothing_imports_report():
    users = {m for m, ts in GRAPH.items() for t in ts
             if room(t) == "report" and room(m) != "report" and t.startswith("biglm.")}
    assert users == set(), users


def test_only_entry_points_import_integrations():
    users = {m for m, ts in GRAPH.items() for t in ts if t.startswith("biglm.integrations")
             and room(m) != "integrations" and not is_entry_point(m)}
    assert users == set(), f"core modules import the integrations room: {sorted(users)}"


@pytest.mark.parametrize("framework", ["lm_eval", "ray", "sentence_transformers", "transformers.pipelines"])
def test_frameworks_are_imported_only_in_integrations(framework):
    users = {m for m, ts in GRAPH.items() for t in ts
             if (t == framework or t.startswith(framework + ".")) and room(m) != "integrations"}
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
