"""`biglm recipes`: the paper's pre-training recipes, one line each."""

from __future__ import annotations

import argparse

from .recipes import RECIPES, get_recipe


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="biglm recipes", description=__doc__)
    parser.add_argument("name", nargs="?", help="show one recipe in full")
    args = parser.parse_args(argv)
    if args.name:
        import json

        print(json.dumps(get_recipe(args.name).to_dict(), indent=2))
        return 0
    for name in RECIPES:
        c = get_recipe(name)
        obj = c.objective + (f" {c.objective_args}" if c.objective_args else "")
        sched = c.schedule + (f" anneal {c.anneal_fraction:.0%}" if c.schedule == "wsd" else "")
        if c.anneal_data:
            sched += f" on {'+'.join(c.anneal_data)}"
        print(f"{name:<26} {c.preset:<11} {obj:<40} {c.steps:>7} steps lr {c.lr:g} {sched}; data {'+'.join(c.data)}")
    print("\nrun one: biglm pretrain NAME [--local] [--field value ...]")
    return 0
