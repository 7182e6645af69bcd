"""`biglm eval`: zero-shot evaluation of a BiGLM with lm-evaluation-harness (``--model biglm`` implied).

    biglm eval --model_args pretrained=DIR,scorer=chain --tasks piqa,arc_easy --limit 100 --output_path out/
    biglm eval --suite paper --data_dir ../shared/data/eval --model_args pretrained=DIR --limit 200

Flags are lm-eval's own names (``--model_args``, ``--tasks``, ``--num_fewshot``, ``--batch_size``,
``--output_path``, ...); hyphens and underscores are the same (``--data-dir`` = ``--data_dir``).
``--suite paper`` runs the paper's Table 1 columns plus MMLU and LAMBADA from local data in hub
layout (``<data_dir>/<owner>__<name>[/<config>]/<split>.jsonl``), skips the columns whose data is
missing (naming the file), and prints the paper's table at the end.

    biglm eval --suite multitask --data_dir ../shared/data/eval --model_args pretrained=DIR --output_path out/

``--suite multitask`` is Table 5 (`biglm.scoring.multitask`, run by `biglm.integrations.lm_eval.run_multitask`):
MMLU zero-shot and ``--mmlu_fewshot``-shot, the SuperGLUE average over every task folder found under
``<data_dir>/aps__super_glue/``, and Genset (``--genset_n`` seeded instances of each ``--genset`` set, default WikiAuto beside the data dir,
generated with the model's saved decoding settings under the ``--genset_decoding.*`` options given, as `biglm
generate` decodes it, and scored by BLEU-2 / Distinct-2). It prints
Table 5's row and, with ``--output_path``, writes ``multitask.json`` and ``multitask.md`` there.

    biglm eval --suite heldout --heldout_data data/table1-micro --model_args pretrained=RUN --output_path RUN/eval

``--suite heldout`` (`biglm.scoring.heldout`) measures what a small model can show on the ``val`` split of a
prepared token folder: masked loss and fill-in accuracy at the BiGLM setting (the same fixed windows and
masks for every model), and the exact chain-rule perplexity of held-out continuations; it writes
``heldout.json`` (lm-eval's results layout) under ``--output_path``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ..config import given_options
from ..generation.config import DecodingConfig

# biglm eval is an entry point: it drives lm-eval through the integrations room (the runners stay importable from
# here, as before they moved)
from ..integrations.lm_eval import (evaluate, results_tables, run_multitask, run_suite, setup_logging,
                                    write_suite_yamls)
from .multitask import PARTS, parse_genset
from .suite import SUITES, default_data_dir, format_table, select_tasks, suite_table

__all__ = ["EvalArgs", "parse_eval_args", "main", "run_suite", "run_multitask", "evaluate", "write_suite_yamls",
           "suite_table", "format_table", "SUITES"]


@dataclass
class EvalArgs:
    """The options of `biglm eval`, checked before any work starts."""

    model_args: str = ""
    """the biglm adapter's options, key=value,...: pretrained=DIR (required: a `biglm export` directory),
    scorer=auto|chain|one-pass|pll|mc|blocks|append, row_batch_size, mc_samples, dtype, max_length, ..."""
    tasks: tuple[str, ...] = ()
    """lm-eval task names, comma-separated (with --suite the suite chooses them)"""
    include_path: Path | None = None
    """a folder of extra task YAMLs for --tasks, as lm-eval's --include_path"""
    suite: Literal["paper", "multitask", "heldout"] | None = None
    """run a whole suite on local data: paper = Table 1's eleven columns, then MMLU and LAMBADA;
    multitask = Table 5 (MMLU zero/few-shot, SuperGLUE average, Genset BLEU-2/Distinct-2);
    heldout = masked loss, fill-in accuracy and continuation perplexity on --heldout_data's val split"""
    suite_tasks: tuple[str, ...] = ()
    """with --suite: only these columns, comma-separated (e.g. PIQA,ARC-E,LAMBADA; multitask: MMLU,SuperGLUE,Genset)"""
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
    __>/results_<date>.json); --suite multitask writes multitask.json and multitask.md into this folder"""
    log_samples: bool = False
    """also write every document's requests and scores (needs --output_path)"""
    mmlu_fewshot: int = 5
    """--suite multitask: examples per prompt of the MMLU few-shot column (from dev)"""
    genset: list[str] = field(default_factory=list, metadata={"repeatable": True})
    """--suite multitask: a generation set as NAME:PATH:SOURCE:TARGET or a YAML file of {name, path, source, target,
    prompt}; SOURCE/TARGET a field or a template over the row's fields, '{personality}\\n{history}' (lists joined by
    newlines; in the colon form \\n a newline, \\: a colon); repeat for several (default: WikiAuto at
    <data_dir>/../finetune/wikiauto/valid.jsonl)"""
    genset_n: int = 100
    """--suite multitask: instances drawn from each generation set"""
    genset_seed: int = 0
    """--suite multitask: seed of the instance draw (the same instances for a seed)"""
    genset_batch_size: int = 16
    """--suite multitask: prompts generated together"""
    genset_decoding: DecodingConfig = field(default_factory=DecodingConfig)
    """--suite multitask: Genset's decoding options, --genset_decoding.FIELD (steps, max_new_tokens, strategy, ...);
    one not given takes the model's saved setting (a fine-tuned model's answer length and steps), as in biglm
    generate"""
    heldout_data: Path | None = None
    """--suite heldout: a folder written by `biglm data prepare --val_docs N` (its val split is scored)"""
    heldout_windows: int = 256
    """--suite heldout: fixed windows of the val split for the masked loss and fill-in accuracy"""
    heldout_seq_len: int = 128
    """--suite heldout: tokens per window (the run's --seq_len is the comparable choice)"""
    heldout_docs: int = 200
    """--suite heldout: held-out documents whose second half is scored given the first"""
    heldout_seed: int = 0
    """--suite heldout: seed of the fixed masks (the same masks for every model with one seed)"""

    def __post_init__(self) -> None:
        multitask_only = {"mmlu_fewshot": 5, "genset": [], "genset_n": 100, "genset_seed": 0, "genset_batch_size": 16,
                          "genset_decoding": DecodingConfig()}
        heldout_only = {"heldout_data": None, "heldout_windows": 256, "heldout_seq_len": 128, "heldout_docs": 200,
                        "heldout_seed": 0}
        if self.suite == "multitask":
            self._check_multitask()
        elif changed := [k for k, v in multitask_only.items() if getattr(self, k) != v]:
            raise ValueError(f"--{changed[0]} only applies with --suite multitask.")
        if self.suite == "heldout":
            self._check_heldout()
        elif changed := [k for k, v in heldout_only.items() if getattr(self, k) != v]:
            raise ValueError(f"--{changed[0]} only applies with --suite heldout.")
        if self.suite is not None:
            if self.tasks or self.include_path is not None:
                raise ValueError("--suite chooses the tasks and their YAMLs: drop --tasks/--include_path.")
            if self.suite == "heldout" and (self.suite_tasks or self.data_dir is not None):
                raise ValueError("--suite heldout reads --heldout_data: drop --suite_tasks/--data_dir.")
            if self.suite == "paper":
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

    def _check_multitask(self) -> None:
        """The multitask suite's own options, checked before any model or data is loaded."""
        known = {p.lower(): p for p in PARTS}
        bad = [t for t in self.suite_tasks if t.lower() not in known]
        if bad:
            raise ValueError(f"unknown multitask part(s) {', '.join(bad)}; choose from {', '.join(PARTS)}.")
        if self.num_fewshot is not None:
            raise ValueError("--suite multitask runs MMLU zero-shot and --mmlu_fewshot-shot: drop --num_fewshot.")
        if self.log_samples:
            raise ValueError("--log_samples does not apply to --suite multitask: multitask.json under --output_path "
                             "holds every Genset instance and lm-eval's per-task results.")
        for name, value in (("mmlu_fewshot", self.mmlu_fewshot), ("genset_n", self.genset_n),
                            ("genset_batch_size", self.genset_batch_size)):
            if value < 1:
                raise ValueError(f"--{name}={value} must be >= 1.")
        for spec in self.multitask_gensets() or ():
            if not spec.path.startswith("hf:") and not Path(spec.path).is_file():
                raise ValueError(f"--genset {spec.name}: no file {spec.path}")

    def _check_heldout(self) -> None:
        if self.heldout_data is None:
            raise ValueError("--suite heldout needs --heldout_data FOLDER (written by `biglm data prepare --val_docs N`).")
        if not self.heldout_data.is_dir():
            raise ValueError(f"--heldout_data {self.heldout_data}: no such folder.")
        for name in ("heldout_windows", "heldout_seq_len", "heldout_docs"):
            if getattr(self, name) < 2:
                raise ValueError(f"--{name}={getattr(self, name)} must be >= 2.")
        if self.num_fewshot is not None or self.limit is not None or self.log_samples:
            raise ValueError("--num_fewshot, --limit and --log_samples do not apply to --suite heldout.")

    def multitask_parts(self) -> tuple[str, ...]:
        """The multitask parts to run (all by default), in Table 5's order."""
        chosen = {t.lower() for t in self.suite_tasks}
        return tuple(p for p in PARTS if not chosen or p.lower() in chosen)

    def multitask_gensets(self):
        """The parsed ``--genset`` specs, or None for the default (WikiAuto beside the data dir)."""
        return [s for spec in self.genset for s in parse_genset(spec)] if self.genset else None


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
    setup_logging()  # lm-eval's progress lines, as its own CLI shows them
    from ..integrations.lm_eval.adapter import ModelArgsError  # the adapter's refusal of a --model_args value
    common = dict(limit=args.limit, num_fewshot=args.num_fewshot, batch_size=args.batch_size, device=args.device,
                  output_path=args.output_path, log_samples=args.log_samples)
    if args.suite == "multitask":
        return _main_multitask(args, argv)
    if args.suite == "heldout":
        return _main_heldout(args)
    if args.suite is not None:
        data_dir = args.data_dir if args.data_dir is not None else default_data_dir()
        try:
            model_args = parse_model_args(args.model_args)
            results = run_suite(model_args.pop("pretrained"), data_dir=data_dir, suite=args.suite,
                                only=args.suite_tasks, model_args=model_args, **common)
        except (FileNotFoundError, ModelArgsError) as e:  # no column of the suite has data; a bad model_arg
            print(f"biglm eval: {e}", file=sys.stderr)
            return 2
    else:
        try:
            results = evaluate(model_args=args.model_args, tasks=args.tasks, include_path=args.include_path, **common)
        except (ModelArgsError, FileNotFoundError, ValueError) as e:  # a bad model_arg; a model that cannot load
            print(f"biglm eval: {e}", file=sys.stderr)
            return 2
        except ConnectionError as e:  # datasets: "Couldn't reach 'baber/piqa' on the Hub (LocalEntryNotFoundError)"
            print(f"biglm eval: {hub_unreachable(e, args.tasks)}", file=sys.stderr)
            return 2
    if not results:  # not rank 0 under torchrun
        return 0
    results.pop("samples", None)
    print(results_tables(results))
    config = results.get("config", {})
    if config.get("biglm_scorer"):  # what scorer=auto resolved to (also in the results JSON's config)
        cache = config.get("biglm_score_cache")
        print(f"biglm scorer: {config['biglm_scorer']}{f' ({cache} cache)' if cache else ''}")
    if args.suite is not None:
        header, row = results["biglm_suite"]["header"], results["biglm_suite"]["row"]
        print(f"\nBiGLM zero-shot, suite {args.suite!r} (acc_norm: PIQA, ARC-C, LogiQA, HellaS; acc elsewhere; "
              "Avg over the Table 1 columns that ran)")
        print(format_table(header, row))
    return 0


def hub_unreachable(e: BaseException, tasks: tuple[str, ...]) -> str:
    """One line for a task whose data lm-eval could not fetch: what happened, and how to point biglm at local files
    (`--suite paper --suite_tasks ... --data_dir`, hub layout) for the tasks the paper suite knows."""
    first = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
    local = [t for t in select_tasks(None) if t.task in tasks]
    if local:
        where = ", ".join(f"<data_dir>/{t.hub}{'/' + t.config if t.config else ''}/{t.splits[0]}.jsonl" for t in local)
        fix = (f"to read local files instead, run biglm eval --suite paper --suite_tasks "
               f"{','.join(t.column for t in local)} --data_dir DIR (files in the hub's layout: {where})")
    else:
        fix = ("to use local files, give the task a YAML whose dataset_path is a local folder (--include_path), or "
               "fill the datasets cache where the Hub is reachable and set HF_DATASETS_OFFLINE=1")
    return f"lm-eval fetches each task's data from the Hugging Face Hub, and it cannot be reached ({first}); {fix}"


def _main_multitask(args: EvalArgs, argv: list[str]) -> int:
    """`biglm eval --suite multitask`: run Table 5's suite, print its row (and write it with --output_path). Genset
    decodes with the model's saved settings under the --genset_decoding flags given (a flag not given: the model's)."""
    model_args = parse_model_args(args.model_args)
    given = given_options(EvalArgs, argv).get("genset_decoding") or {}
    try:
        summary = run_multitask(model_args.pop("pretrained"), data_dir=args.data_dir, parts=args.multitask_parts(),
                                gensets=args.multitask_gensets(), genset_n=args.genset_n, genset_seed=args.genset_seed,
                                genset_batch_size=args.genset_batch_size, decoding={name: getattr(args.genset_decoding, name) for name in given},
                                mmlu_fewshot=args.mmlu_fewshot, limit=args.limit, batch_size=args.batch_size,
                                device=args.device, model_args=model_args, output_path=args.output_path)
    except (FileNotFoundError, ValueError) as e:  # no part has data; a genset file or field that is wrong
        print(f"biglm eval: {e}", file=sys.stderr)
        return 2
    if not summary:  # not rank 0 under torchrun
        return 0
    print(f"\nBiGLM multitask suite (Table 5 layout)\n{summary['table']}")
    if args.output_path is not None:
        print(f"\nwritten: {Path(args.output_path) / 'multitask.json'}, {Path(args.output_path) / 'multitask.md'}")
    return 0


def _main_heldout(args: EvalArgs) -> int:
    """`biglm eval --suite heldout`: the held-out metrics of one model, printed (and written with --output_path)."""
    from ..data.shards import ShardError
    from .heldout import format_heldout, run_heldout

    model_args = parse_model_args(args.model_args)
    try:
        result = run_heldout(model_args["pretrained"], data=args.heldout_data, output_path=args.output_path,
                             device=args.device, windows=args.heldout_windows, seq_len=args.heldout_seq_len,
                             docs=args.heldout_docs, seed=args.heldout_seed,
                             **({"batch_size": int(args.batch_size)} if args.batch_size not in (None, "auto") else {}))
    except (FileNotFoundError, ValueError, ShardError) as e:  # a missing val split, too little held-out text, a wrong tokenizer
        print(f"biglm eval: {e}", file=sys.stderr)
        return 2
    print(f"\nBiGLM held-out metrics ({args.heldout_data}, val split)\n{format_heldout(result)}")
    if args.output_path is not None:
        print(f"\nwritten: {Path(args.output_path) / 'heldout.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
