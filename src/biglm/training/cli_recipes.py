"""`biglm recipes [NAME]`: the pre-training recipes (the paper's experiments and the built-in default),
one line each; with NAME, that recipe in full as YAML (a file `biglm pretrain` reads back)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..objective import OBJECTIVES
from .recipes import RECIPES, get_recipe


@dataclass
class RecipesArgs:
    name: str | None = None
    """show one recipe in full, as YAML"""


def _objective(obj) -> str:
    """The objective as its variant name plus the fields that differ from the variant."""
    base = OBJECTIVES.get(obj.name)
    if base is None:
        return obj.name
    diff = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if getattr(obj, f.name) != getattr(base, f.name)}
    return obj.name + "".join(f" {k}={v}" for k, v in diff.items())


def _shape(cfg) -> str:
    """The preset, or layers x width where the recipe's model fields change the preset's shape (the default's 4 x 192
    is no `tiny`)."""
    from ..model.config import BiGLMConfig
    from .config import INIT_MODEL_FIELDS

    if not any(k not in INIT_MODEL_FIELDS for k in cfg.model.overrides()):
        return cfg.preset
    built = BiGLMConfig.from_preset(cfg.preset, **cfg.model.overrides())
    return f"{built.num_hidden_layers}x{built.hidden_size}"


def main(argv: list[str]) -> int:
    from ..config import ConfigError, fail, parse_cli, to_dict

    args = parse_cli(RecipesArgs, argv, prog="biglm recipes", doc=__doc__, positionals=("name",))
    if args.name:
        import yaml

        try:
            cfg = get_recipe(args.name)
        except ConfigError as e:
            fail("biglm recipes", str(e))
        print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
        return 0
    for name in RECIPES:
        c = get_recipe(name)
        sched = c.schedule + (f" anneal {c.anneal_fraction:.0%}" if c.schedule == "wsd" else "")
        if c.anneal_data:
            sched += f" on {'+'.join(c.anneal_data)}"
        shape = "--init_from" if c.requires_init else _shape(c)  # continued pre-training: the source's shape
        print(f"{name:<26} {shape:<11} {_objective(c.objective):<40} {c.steps:>7} steps lr {c.lr:g} {sched}; "
              f"data {'+'.join(c.data)}")
    print("\nrun one: biglm pretrain NAME [--local] [--field value ...]; `biglm pretrain NAME --help` lists the fields")
    return 0
