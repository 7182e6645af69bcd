"""`biglm generate CHECKPOINT --prompt TEXT ...`: write answers by iterative unmasking.

Prints one block per prompt: a ``### prompt i: ...`` header line, then the answer. With
``--show-steps`` every model call is printed first, with masked slots shown as ``_``, so one
can watch the answer unmask (Mask-Predict prints the re-masked input and the new prediction); ``--show`` instead
redraws the answer's canvas in place on the terminal (stderr) after every call (`canvas.LiveCanvas`), coloured by
what the call did, stdout unchanged.
Exit codes: 0 ok, 2 bad arguments or missing checkpoint, 130 Ctrl-C (each answer printed as far as it was written,
unwritten slots as ``_``, then one ``[biglm] interrupted ...`` line on stderr).

The options are the fields of `GenerateArgs`: the checkpoint, ``--prompt`` (repeatable),
``--device``/``--dtype``/``--show_steps`` and every `DecodingConfig` field (help = the field's
docstring; booleans as ``--early_stop`` or ``--early_stop false``), parsed by `biglm.config` like
every command and validated before the model is loaded. The default is the published Mask-Predict (T model calls);
``--early-stop`` opts in to ending a row once an iteration changes nothing. A fine-tuned model carries the decoding
settings it was validated with (``max_new_tokens``, ``steps``, ``length_beam`` in ``config.task_specific_params``);
an option not given on the command line takes the model's value (`config.model_decoding`, as in `biglm chat` and
`biglm serve`); ``--steps none`` clears a saved value (an option refused with a saved value says so). A model with a
length head (a CMLM seq2seq fine-tune) picks each answer's length with it (``--length_head false`` to use the length
beam instead).

Batch generation over files (`biglm.generation.batch`): ``--input prompts.jsonl --output answers.jsonl`` instead of
``--prompt``. Each input line is a JSON object with an ``id``, a ``prompt`` or chat ``messages``, and optionally any
decoding option for that row (the command's options are the defaults); each output line holds the id, the answer's
``text``, ``finish_reason`` and token counts, appended batch by batch (``--batch_size`` rows with the same settings
decoded together), with a progress bar on stderr. Running the same command again after a stop continues where it
stopped; on a finished output it changes nothing. The model and settings that wrote the answers are recorded in
``OUTPUT.meta.json``: continuing with another model or other settings is refused, naming what differs. A malformed
input row is named as FILE:LINE before any work.
``--replicas N`` answers the batches on Ray Data (an actor pool of N model holders, on a local Ray instance or the
cluster at ``--ray_address``) with the same output file.

    biglm generate runs/finetune-flan --input prompts.jsonl --output answers.jsonl --steps 8
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from ..config import ConfigError, given_options, parse_cli
from .config import FIELDS, DecodingConfig, model_decoding
from .decoding import StepInfo
from .strategies import get_strategy

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ReplicaOptions:
    """Options of a command that can run on a Ray cluster (`biglm serve`, `biglm generate --input`): without
    ``--replicas`` the command runs in this process alone and these options must be left unset."""

    replicas: int | None = None
    """run on Ray with N replicas, each holding one model (unset: this process alone; needs `biglm[ray]`)"""
    replica_cpus: int = 1
    """with --replicas: CPUs each replica reserves, and its torch threads"""
    replica_gpus: float = 0.0
    """with --replicas: GPUs each replica reserves (> 0: the replica's model runs on cuda, else on cpu)"""
    ray_address: str | None = None
    """with --replicas: an existing Ray cluster, HOST:PORT or auto (unset: start a local Ray instance)"""

    def check_replicas(self) -> None:
        """One-line `ConfigError` for a bad value, or a Ray option given without --replicas."""
        if self.replicas is None:
            stray = [name for name, unset in (("replica_cpus", 1), ("replica_gpus", 0.0), ("ray_address", None))
                     if getattr(self, name) != unset]
            if stray:
                raise ConfigError(f"--{stray[0]} goes with --replicas N (the replicas it configures)")
            return
        if self.replicas < 1:
            raise ConfigError(f"--replicas {self.replicas} must be >= 1")
        if self.replica_cpus < 1:
            raise ConfigError(f"--replica_cpus {self.replica_cpus} must be >= 1")
        if self.replica_gpus < 0:
            raise ConfigError(f"--replica_gpus {self.replica_gpus:g} must be >= 0")
        if self.ray_address is not None and self.ray_address != "auto":
            host, sep, port = self.ray_address.rpartition(":")
            if not (sep and host and port.isdigit() and 0 < int(port) <= 65535):
                raise ConfigError(f"--ray_address {self.ray_address!r}: give HOST:PORT of a Ray head (e.g. "
                                  "10.0.0.5:6379) or auto")


@dataclass(frozen=True)
class GenerateArgs(ReplicaOptions, DecodingConfig):
    """Generate text with a BiGLM by iterative unmasking (Mask-Predict, confidence-ordered commit or the
    threshold rule), using the exact prefix cache."""

    checkpoint: str = ""
    """exported Hugging Face directory, training run or checkpoint directory"""
    prompt: list[str] = field(default_factory=list, metadata={"repeatable": True})
    """text to continue; repeat the flag for a batch"""
    input: str | None = None
    """a JSONL file of prompts to answer into --output (one object per line: id, prompt or messages, and any
    decoding option for that row); instead of --prompt"""
    output: str | None = None
    """the JSONL file --input's answers go to (continued where a stopped run left it)"""
    batch_size: int = 16
    """with --input: rows with the same settings decoded together"""
    progress: bool = True
    """with --input: a progress bar on stderr"""
    device: str = "cuda" if torch.cuda.is_available() else "cpu"
    """where the model runs"""
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """weights' dtype (unset: the checkpoint's)"""
    compile: bool = False
    """torch.compile each decoder layer (dynamic shapes: compiled once, at the first call, instead of the prepacked
    CPU kernels); for accelerators: on a CPU at batch 1 the default prepacked eager path is faster (docs/LOG.md)"""
    batch_invariant: bool = False
    """each answer independent of the others decoded beside it (kernels whose rows do not depend on the other rows:
    the same answer alone, batched or under any load); bfloat16 weights on a CPU, without --compile; about 4% fewer
    tokens/s alone, 9% at 32 concurrent requests (docs/serving.md)"""
    show_steps: bool = False
    """print the answer after every model call, masked slots as _"""
    show: bool = False
    """redraw the answer's canvas in place on the terminal (stderr) after every model call: masked slots, the tokens
    each call writes, re-masked ones, drafts kept and rejected, the counts; stdout gets what it gets without it"""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.batch_invariant and (self.compile or self.device != "cpu"):
            raise ConfigError("--batch_invariant runs on a CPU without --compile (its kernels are measured "
                              "row-invariant there): drop --compile / pass --device cpu, or drop --batch_invariant")
        if self.batch_invariant and self.replicas is not None:
            raise ConfigError("--batch_invariant applies to one process: drop --replicas, or --batch_invariant")
        if not self.checkpoint:
            raise ConfigError("missing CHECKPOINT: a directory written by `biglm export` or `biglm pretrain`")
        if self.input is not None:
            if self.prompt:
                raise ConfigError("--prompt and --input exclude each other: give prompts on the command line or in "
                                  "a file")
            if not self.output:
                raise ConfigError("--input needs --output FILE (the JSONL file the answers go to)")
            if self.batch_size < 1:
                raise ConfigError(f"--batch_size {self.batch_size} must be >= 1")
            if self.show_steps or self.show:
                raise ConfigError(f"--{'show' if self.show else 'show_steps'} applies to --prompt only")
            self.check_replicas()
        elif self.output is not None:
            raise ConfigError("--output goes with --input (a file of prompts); --prompt answers print to stdout")
        elif self.replicas is not None or self.ray_address is not None:
            raise ConfigError("--replicas/--ray_address go with --input FILE --output FILE (batch generation on Ray)")
        elif not self.prompt:
            raise ConfigError("missing --prompt TEXT (repeat it for a batch) or --input FILE --output FILE")
        if self.show and self.show_steps:
            raise ConfigError("--show redraws the steps in place, --show_steps prints each one: pick one")


def cli_decoding(args: DecodingConfig, argv: list[str], model) -> DecodingConfig:
    """The decoding options of a command (`biglm generate`, `biglm chat`): `model_decoding`, the model's saved
    settings under the `DecodingConfig` flags given on the command line (a flag not given takes the model's value)."""
    given = given_options(type(args), argv)
    return model_decoding(model.config, {name: getattr(args, name) for name in FIELDS if name in given},
                          clear="--{name} {value}")


def ray_integration(name: str, *, given: Mapping[str, Any], prog: str) -> Any:
    """``biglm.integrations.<name>`` for a ``--replicas`` run, or None after one line on stderr: ``--device`` was
    given (the replicas' device follows ``--replica_gpus``), or Ray is not installed."""
    if "device" in given:
        print(f"{prog}: --device applies to one process; replicas run on cuda with --replica_gpus > 0, else on cpu",
              file=sys.stderr)
        return None
    try:
        return importlib.import_module(f"biglm.integrations.{name}")
    except ImportError as e:
        print(f"{prog}: --replicas needs Ray ({e}): pip install 'biglm[ray]'", file=sys.stderr)
        return None


def _render(tokenizer, ids: list[int], mask_id: int) -> str:
    # decode with the mask token kept, then show each mask as "_"
    text = tokenizer.decode(ids, skip_special_tokens=False)
    mask_text = tokenizer.convert_ids_to_tokens(mask_id)
    return text.replace(mask_text, "_") if mask_text else text


def _step_printer(tokenizer, mask_id: int):
    def show(info: StepInfo) -> None:
        for r in range(info.output_ids.shape[0]):
            n = int(info.candidate_length[r])
            label = f"prompt {int(info.prompt_index[r]) + 1}"
            if info.candidate_length.unique().numel() > 1:
                label += f" (length {n})"
            head = f"[step {info.step}/{info.total_steps}] {label}, {int(info.num_masked[r])} masked"
            after = _render(tokenizer, info.output_ids[r, :n].tolist(), mask_id)
            if get_strategy(info.strategy).remasks:  # a re-masking step rewrites tokens: show before and after
                before = _render(tokenizer, info.input_ids[r, :n].tolist(), mask_id)
                print(f"{head}: {before}\n{' ' * len(head)}  -> {after}", flush=True)
            else:
                print(f"{head}: {after}", flush=True)
    return show


class _LastStep:
    """An ``on_step`` that keeps the last `StepInfo` a decode reported (what Ctrl-C prints) and passes each one on
    to ``then`` (the printer of --show_steps, the canvas of --show)."""

    def __init__(self, then: Any = None) -> None:
        self.then, self.info = then, None

    def __call__(self, info: StepInfo) -> None:
        self.info = info
        if self.then is not None:
            self.then(info)


def _interrupted(prompts: list[str], info: StepInfo | None, tokenizer, model_config) -> int:
    """After Ctrl-C: each prompt's answer as the last model call left it (unwritten slots as ``_``, cut at its end
    token and before its trailing unwritten slots; a length beam's first candidate), then one line on stderr; 130."""
    mask_id, eos = model_config.mask_token_id, model_config.eos_token_id
    if info is not None and sys.stdout.isatty():
        print()  # past the ^C the terminal echoed
    for i, prompt in enumerate(prompts if info is not None else []):
        rows = (info.prompt_index == i).nonzero()
        if not rows.numel():
            continue
        r = int(rows[0])
        ids = info.output_ids[r, :int(info.candidate_length[r])].tolist()
        if eos in ids:
            ids = ids[:ids.index(eos)]
        while ids and ids[-1] == mask_id:
            ids.pop()
        print(f"### prompt {i + 1}: {prompt}")
        print(_render(tokenizer, ids, mask_id), flush=True)
    where = "before the first model call" if info is None else \
        f"after model call {info.step} of {info.total_steps}: the answers above are partial (_ = not written yet)"
    print(f"[biglm] interrupted {where}", file=sys.stderr, flush=True)
    return 130


def load_for_cli(path: Path, *, prog: str, device: str | None, dtype: str | None, compile: bool = False,
                 batch_invariant: bool = False):
    """``(model, tokenizer)`` from a command's checkpoint argument, or None after one line on stderr naming the
    problem (a missing path, or a directory that holds no loadable model)."""
    if not path.exists():
        print(f"{prog}: no checkpoint at {path}: pass a fine-tuning run, a directory written by `biglm export` "
              "or `biglm pretrain` (or a Hugging Face model directory).", file=sys.stderr)
        return None
    from ..checkpoint import load_model

    try:
        return load_model(path, device=device, dtype=_DTYPES.get(dtype) if dtype else None, pack=True,
                          compile=compile, batch_invariant=batch_invariant)
    except (FileNotFoundError, OSError, ValueError) as e:
        print(f"{prog}: cannot load {path}: {e}", file=sys.stderr)
        return None


def main(argv: list[str]) -> int:
    """Entry point of `biglm generate`; ``argv`` excludes the word "generate"."""
    try:
        args = parse_cli(GenerateArgs, argv, prog="biglm generate", doc=__doc__, positionals=("checkpoint",))
    except SystemExit as e:  # --help (0) or a bad option (2, message printed): callers want a return code
        return int(e.code or 0)
    from .api import generate

    if args.input is not None:
        return _main_file(args, argv)
    loaded = load_for_cli(Path(args.checkpoint), prog="biglm generate", device=args.device, dtype=args.dtype,
                          compile=args.compile, batch_invariant=args.batch_invariant)
    if loaded is None:
        return 2
    model, tokenizer = loaded
    mask_id = model.config.mask_token_id
    on_step = _step_printer(tokenizer, mask_id) if args.show_steps and mask_id is not None else None
    live = None
    if args.show and mask_id is not None:
        from .canvas import LiveCanvas

        live = LiveCanvas(tokenizer, mask_id)
        on_step = live.recorder
    last = _LastStep(on_step)
    try:
        config = cli_decoding(args, argv, model)  # the model's saved settings under the flags given
        with live if live is not None else contextlib.nullcontext():
            answers = generate(model, tokenizer, args.prompt, config=config, on_step=last)
    except (ValueError, TypeError) as e:
        print(f"biglm generate: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: what each answer holds so far, one line, 130 (no traceback)
        if live is not None and not live.console.is_terminal:
            print(file=sys.stderr)  # the canvas's last frame ends its line on a terminal only
        return _interrupted(args.prompt, last.info, tokenizer, model.config)
    for i, (prompt, answer) in enumerate(zip(args.prompt, answers), start=1):
        print(f"### prompt {i}: {prompt}")
        print(answer)
    return 0


def _main_file(args: GenerateArgs, argv: list[str]) -> int:
    """`biglm generate --input FILE --output FILE`: the input is checked before the model is loaded (and before Ray
    starts, with --replicas: the batches are then answered on Ray Data, `biglm.integrations.ray_data`)."""
    from .batch import BatchInputError, read_rows

    prog = "biglm generate"
    try:
        read_rows(args.input)  # a malformed row fails here, before the model is loaded (`generate_file` reads again)
    except BatchInputError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    if args.output is not None and Path(args.output).is_dir():  # a folder (a run's, say) is never written into
        print(f"{prog}: --output {args.output} is a folder: give the JSONL file the answers go to (e.g. "
              f"{Path(args.output) / 'answers.jsonl'})", file=sys.stderr)
        return 2
    given = given_options(type(args), argv)
    backend, cluster = None, None
    if args.replicas is not None:
        ray_data = ray_integration("ray_data", given=given, prog=prog)
        if ray_data is None:
            return 2
        from ..integrations import ray_cluster

        try:
            cluster = ray_cluster.connect(args.ray_address, cpus=args.replicas * args.replica_cpus,
                                          gpus=args.replicas * args.replica_gpus)
        except ray_cluster.ClusterError as e:
            print(f"{prog}: {e}", file=sys.stderr)
            return 2
        backend = ray_data.ray_data_backend(str(Path(args.checkpoint).resolve()), replicas=args.replicas,
                                            cpus=args.replica_cpus, gpus=args.replica_gpus, dtype=args.dtype,
                                            compile=args.compile)
    try:
        return _run_file(args, given, backend, prog)
    finally:
        if cluster is not None:
            ray_cluster.disconnect(cluster)


def _run_file(args: GenerateArgs, given: dict, backend, prog: str) -> int:
    from ..checkpoint.lock import RunDirLockedError
    from .batch import generate_file

    # with replicas, this copy only checks and prepares the rows (the model's settings, token ids): on the cpu
    device = "cpu" if backend is not None else args.device
    loaded = load_for_cli(Path(args.checkpoint), prog=prog, device=device, dtype=args.dtype,
                          compile=args.compile and backend is None,  # with replicas, each holder compiles its own
                          batch_invariant=args.batch_invariant)
    if loaded is None:
        return 2
    model, tokenizer = loaded
    options = {name: getattr(args, name) for name in FIELDS if name in given}  # the rest: the model's settings
    try:
        report = generate_file(model, tokenizer, args.input, args.output, config=options, batch_size=args.batch_size,
                               progress=args.progress, backend=backend, model_path=args.checkpoint)
    except (RunDirLockedError, ValueError, TypeError) as e:  # (BatchInputError is a ValueError)
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # every finished batch is in the file
        print(f"\n{prog}: stopped; run the same command again to continue {args.output}", file=sys.stderr)
        return 130
    if report.written == 0:
        print(f"{prog}: {args.output} already holds all {report.rows} rows: nothing to do", file=sys.stderr)
    else:
        print(f"{prog}: wrote {report.written} rows to {args.output} ({report.done_before} were there already) in "
              f"{report.seconds:.1f} s, {report.rows_per_second:.2f} rows/s", file=sys.stderr)
    return 0
