"""`biglm eval`: zero-shot evaluation of a BiGLM with lm-evaluation-harness (``--model biglm`` implied).

    biglm eval --model_args pretrained=DIR,scorer=chain --tasks piqa,arc_easy --limit 100 --output_path out/
    biglm eval --suite paper --data_dir ../shared/data/eval --model_args pretrained=DIR --limit 200

Flags are lm-eval's own names (``--model_args``, ``--tasks``, ``--num_fewshot``, ``--batch_size``,
``--output_path``, ...); hyphens and underscores are the same (``--data-dir`` = ``--data_dir``).
``--suite paper`` runs the paper's Table 1 columns plus MMLU and LAMBADA from local data in hub
layout (``<data_dir>/<owner>__<name>[/<config>]/<split>.jsonl``), skips the columns whose data is
missing (naming the file), and prints the paper's table at the end.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

# the suite definition and the lm-eval runner, importable from here as before the split
from .harness import evaluate, run_suite
from .suite import SUITES, default_data_dir, format_table, select_tasks, suite_table, write_suite_yamls

__all__ = ["EvalArgs", "parse_eval_args", "main", "run_suite", "evaluate", "write_suite_yamls", "suite_table",
           "format_table", "SUITES"]


@dataclass
class EvalArgs:
    """The options of `biglm eval`, checked before any work starts."""

    model_args: str = ""
    """the biglm adapter's options, key=value,...: pretrained=DIR (required: a `biglm export` directory),
    scorer=chain|one-pass|pll|mc, row_batch_size, mc_samples, dtype, max_length, ..."""
    tasks: tuple[str, ...] = ()
    """lm-eval task names, comma-separated (with --suite the suite chooses them)"""
    include_path: Path | None = None
    """a folder of extra task YAMLs for --tasks, as lm-eval's --include_path"""
    suite: Literal["paper"] | None = None
    """run a whole suite on local data: paper = Table 1's eleven columns, then MMLU and LAMBADA"""
    suite_tasks: tuple[str, ...] = ()
    """with --suite: only these columns, comma-separated (e.g. PIQA,ARC-E,LAMBADA)"""
    data_dir: Path | None = None
    """with --suite: eval data in hub layout <owner>__<name>[/<config>]/<split>.jsonl
    (default $BIGLM_EVAL_DATA, else ./data/eval)"""
    limit: float | None = None
    """documents per task (a fraction when below 1); for quick checks, not for reported numbers"""
    num_fewshot: int | None = None
    """few-shot examples per prompt (default: each task's own, 0 for the paper suite)"""
    batch_size: int | str | None = None
    """contexts encoded per batch (default: the adapter's, 16; auto = the same)"""
    device: str | None = None
    """cpu, cuda, cuda:1, ... (default: cuda when available)"""
    output_path: Path | None = None
    """write lm-eval's results JSON here, as lm-eval does (a folder: <output_path>/<pretrained with / as
    __>/results_<date>.json)"""
    log_samples: bool = False
    """also write every document's requests and scores (needs --output_path)"""

    def __post_init__(self) -> None:
        if self.suite is not None:
            if self.tasks or self.include_path is not None:
                raise ValueError("--suite chooses the tasks and their YAMLs: drop --tasks/--include_path.")
            select_tasks(self.suite_tasks)  # unknown column names fail here, before any model is loaded
        else:
            if self.suite_tasks or self.data_dir is not None:
                raise ValueError("--data_dir and --suite_tasks only apply with --suite.")
            if not self.tasks:
                raise ValueError("nothing to run: pass --tasks NAME[,NAME...] or --suite paper.")
        if self.log_samples and self.output_path is None:
            raise ValueError("--log_samples needs --output_path.")
        pretrained = parse_model_args(self.model_args).get("pretrained")
        if pretrained is None:
            raise ValueError("missing pretrained: pass --model_args pretrained=DIR "
                             "(a directory written by `biglm export`).")
        if not Path(pretrained).exists():
            raise ValueError(f"no model at {pretrained}: pass --model_args pretrained=DIR with a directory written by "
                             "`biglm export` or `save_pretrained` (config.json + model.safetensors + tokenizer).")


def parse_model_args(model_args: str) -> dict[str, str]:
    """``key=value,...`` as a dict of strings (lm-eval converts the types when it builds the model)."""
    pairs = (kv.split("=", 1) for kv in model_args.split(",") if kv.strip())
    return {k.strip(): v.strip() for k, v in (p if len(p) == 2 else (p[0], "") for p in pairs)}


def parse_eval_args(argv: list[str]) -> EvalArgs:
    """`biglm eval`'s command line as `EvalArgs`, with the typed parser every subcommand uses
    (errors: one line on stderr and SystemExit(2); ``--help`` lists the fields' docstrings)."""
    from ..config import parse_cli

    return parse_cli(EvalArgs, argv, prog="biglm eval", doc=__doc__)


def main(argv: list[str]) -> int:
    try:
        args = parse_eval_args(argv)
    except SystemExit as e:  # --help (0) or a bad option (2, already reported)
        return e.code if isinstance(e.code, int) else 0
    from lm_eval.utils import make_table, setup_logging

    setup_logging()  # lm-eval's progress lines, as its own CLI shows them
    common = dict(limit=args.limit, num_fewshot=args.num_fewshot, batch_size=args.batch_size, device=args.device,
                  output_path=args.output_path, log_samples=args.log_samples)
    if args.suite is not None:
        data_dir = args.data_dir if args.data_dir is not None else default_data_dir()
        try:
            model_args = parse_model_args(args.model_args)
            results = run_suite(model_args.pop("pretrained"), data_dir=data_dir, suite=args.suite,
                                only=args.suite_tasks, model_args=model_args, **common)
        except FileNotFoundError as e:  # no column of the suite has data
            print(f"biglm eval: {e}", file=sys.stderr)
            return 2
    else:
        results = evaluate(model_args=args.model_args, tasks=args.tasks, include_path=args.include_path, **common)
    if not results:  # not rank 0 under torchrun
        return 0
    results.pop("samples", None)
    print(make_table(results))
    if "groups" in results:
        print(make_table(results, "groups"))
    if args.suite is not None:
        header, row = results["biglm_suite"]["header"], results["biglm_suite"]["row"]
        print(f"\nBiGLM zero-shot, suite {args.suite!r} (acc_norm: PIQA, ARC-C, LogiQA, HellaS; acc elsewhere; "
              "Avg over the Table 1 columns that ran)")
        print(format_table(header, row))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
