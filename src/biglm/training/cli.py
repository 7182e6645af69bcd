"""`biglm pretrain [RECIPE | recipe.yaml] [--local] [--field value ...]`

Pre-train a BiGLM. RECIPE is a name from `biglm recipes` or a YAML/JSON file of TrainConfig fields;
``--local`` shrinks a paper recipe to a few minutes (fewer steps, smaller batch, shorter windows).
Any field below can be overridden: ``--steps 1000 --lr 1e-3 --data data/fineweb-edu``, model
fields as ``--model.hidden_dropout 0.1``, the objective as ``--objective mlm`` and its fields as
``--objective.alpha 0.3``. Unknown names and wrong types are refused before any work starts;
``--print_config`` shows the resolved configuration as YAML (a valid recipe file). ``--preset NAME`` (`biglm
presets`) is the model's shape: the recipe's own shape fields give way to it (``biglm pretrain --preset biglm-124m``
trains the 124M shape, not the default's 4 x 192), its dropouts and max_position_embeddings stay, and
``--model.FIELD`` on the same command line still changes the preset.

With no RECIPE, the `default` recipe: a small BiGLM trained on English text every Python
installation carries (its documentation topics and standard-library docstrings, read at run time),
with a tokenizer trained on the spot; no network, a few minutes on a CPU. It ends by
showing what the model learned against a unigram baseline (word frequencies, no context): the
validation loss, where the gold word ranks when 15% of held-out text is hidden, how far context moves
up the words frequency cannot guess, and fill-ins for sentences whose context decides the word (`demo`).
``--data DIR`` trains the same model on your prepared data instead.

``--init_from DIR`` continues training an existing BiGLM (a `biglm export` directory or a run directory, its
newest checkpoint): its shape, tokenizer and weights are the start, with a fresh optimizer at step 0 and the
recipe's schedule; the data must be prepared with its tokenizer (other data is refused before any step; the
built-in text is prepared with it). ``--preset`` and the shape fields of ``--model`` are refused with it (the
dropouts and max_position_embeddings may change); the objective decides the model's prefix_attention
(`blocks-adapt` turns a paper model into a biglm-blocks one). A run with checkpoints resumes from them instead.

The same command runs on many processes: ``torchrun --nproc_per_node N -m biglm pretrain RECIPE``.
A run resumes from its newest checkpoint when started again with the same output directory. Ctrl-C (SIGINT) or
SIGTERM stops it after the step in progress, with that step's checkpoint (or a line saying why it could not be
written), and the command exits 130 (SIGINT) or 143 (SIGTERM), so ``biglm pretrain ... && biglm export ...`` stops
there too.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Callable

from ..config import ConfigError, apply_overrides, fail, format_help, given_options
from .config import BUILTIN, INIT_MODEL_FIELDS, ModelArgs, TrainConfig, load_recipe_file
from .recipes import RECIPES, get_recipe

DEFAULT_VOCAB = 4096  # the built-in corpus's tokenizer
PROG = "biglm pretrain"

def prepare_builtin_data(out: Path, *, tokenizer: str | Path | None = None) -> tuple[Path, Path]:
    """Tokenizer and shards of the built-in corpus under ``out/data`` (reused when already built). ``tokenizer``:
    prepare with that one (an --init_from model's, or --tokenizer) instead of training one."""
    from ..data import builtin_corpus, prepare, train_tokenizer

    data_dir = out / "data"
    tok_dir = Path(tokenizer) if tokenizer is not None else data_dir / "tokenizer"
    if tokenizer is None and not (tok_dir / "tokenizer.json").exists():
        print(f"[biglm] training a {DEFAULT_VOCAB}-token byte-level BPE tokenizer on the built-in corpus -> {tok_dir}")
        train_tokenizer(texts=builtin_corpus(), vocab_size=DEFAULT_VOCAB, out_dir=str(tok_dir))
    prepare(sources=["builtin"], tokenizer=str(tok_dir), out_dir=data_dir, val_docs=60, workers=None)
    return data_dir, tok_dir


def resolve_config(argv: list[str], *, note: Callable[[str], None] | None = None) -> TrainConfig:
    """The run's config from ``[RECIPE | file.yaml] [--local] [--field value ...]``; `ConfigError` if wrong.
    ``note`` gets a line for each recipe setting fitted to the run (`fit_to_steps`)."""
    local = "--local" in argv
    argv = [a for a in argv if a != "--local"]
    if argv and not argv[0].startswith("--"):
        name, rest = argv[0], argv[1:]
        base = load_recipe_file(name) if Path(name).suffix in {".yaml", ".yml", ".json"} else get_recipe(name, local=local)
    else:
        if local:
            raise ConfigError("--local shrinks a paper recipe: name one (see `biglm recipes`); the default is already small")
        base, rest = get_recipe("default"), argv
    cfg = apply_overrides(base, rest)
    given = given_options(TrainConfig, rest)
    cfg = fit_to_steps(cfg, given, note=note)
    if cfg.init_from:
        cfg = _init_from_recipe(cfg, given)
    elif "preset" in given:  # the shape the user asked for, not the recipe's fields laid over it
        cfg = dataclasses.replace(cfg, model=_recipe_model(cfg, given, keep=INIT_MODEL_FIELDS))
    return cfg


STEP_SPANS = ("warmup_steps", "attention_anneal_steps")
"""settings counted in steps that must fit in --steps"""


def fit_to_steps(cfg: TrainConfig, given: dict, *, note: Callable[[str], None] | None = None) -> TrainConfig:
    """A recipe's warm-up (or attention anneal) longer than the run's --steps, and not named on the command line,
    is clamped to the run, with a one-line note: ``biglm pretrain --steps 3`` trains (warm-up 3 instead of the
    default recipe's 30). Clamped, not rescaled: every run the recipe's value fits keeps it (29 and 30 steps warm up
    over 29 and 30), so no existing run (or its resume) changes schedule; a run this short is a smoke test. A value
    given on the command line that does not fit is still refused (`TrainConfig.validate`): that is the user's own."""
    changes = {name: cfg.steps for name in STEP_SPANS if name not in given and getattr(cfg, name) > cfg.steps > 0}
    for name in changes:
        if note is not None:
            note(f"[biglm] note: --{name} {cfg.steps}, clamped to --steps: the recipe's {getattr(cfg, name)} does not "
                 "fit the run")
    return dataclasses.replace(cfg, **changes) if changes else cfg


def _recipe_model(cfg: TrainConfig, given: dict, *, keep: tuple[str, ...]) -> ModelArgs:
    """The recipe's model fields once something else decides the shape (an explicit --preset, or --init_from's
    model): only those in ``keep`` stay, and those named on the command line (``--model.FIELD``)."""
    named = given.get("model", {}) if isinstance(given.get("model"), dict) else {}
    return ModelArgs(**{k: v for k, v in dataclasses.asdict(cfg.model).items() if k in keep or k in named})


def _init_from_recipe(cfg: TrainConfig, given: dict) -> TrainConfig:
    """With --init_from the source model decides the shape and the tokenizer: the recipe's preset, shape fields and
    tokenizer give way; the same named explicitly on the command line are refused (`TrainConfig.validate`)."""
    if "preset" in given:
        raise ConfigError(f"--preset {cfg.preset} with --init_from: the model's shape comes from {cfg.init_from}; "
                          "drop --preset")
    # the recipe's dropouts stay (a training choice); any other model field only when named on the command line
    model = _recipe_model(cfg, given, keep=("attention_dropout", "hidden_dropout"))
    tokenizer = cfg.tokenizer if "tokenizer" in given else None
    return dataclasses.replace(cfg, model=model, tokenizer=tokenizer)


def _init_tokenizer(cfg: TrainConfig) -> Path:
    """The tokenizer of --init_from's model (the run's own copy once it has checkpoints: a resume needs no source)."""
    from ..checkpoint import checkpoint_dirs, model_source

    if checkpoint_dirs(cfg.output_dir) and (cfg.output_dir / "tokenizer").is_dir():
        return cfg.output_dir / "tokenizer"
    return model_source(cfg.init_from).tokenizer_dir


def check_inputs(cfg: TrainConfig) -> None:
    """What the run reads, checked before its output directory is made and locked, so that a refused run leaves
    nothing behind: the tokenizer a path names (`check_tokenizer_source`) and every data folder but the built-in
    corpus. (Settings are checked before this, by `TrainConfig.validate`; what only loading can tell, a damaged
    shard, is found later, in a run directory that then exists.)"""
    from ..data.tokenizer import TokenizerError, check_tokenizer_source
    from .data import _missing

    if cfg.tokenizer:
        try:
            check_tokenizer_source(cfg.tokenizer, what="--tokenizer")
        except TokenizerError as e:
            raise ConfigError(str(e)) from None
    for folder in dict.fromkeys([*cfg.data, *(cfg.anneal_data or {}), *(cfg.val_data or [])]):
        if folder != BUILTIN and not Path(folder).exists():
            raise _missing(folder, cfg.hub_sources)


def main(argv: list[str]) -> int:
    from ..checkpoint import CheckpointError
    from ..data import PrepareError
    from ..data.shards import ShardError
    from .checkpoint import hold_run_dir
    from .distributed import destroy_distributed, init_distributed
    from .trainer import NonFiniteLossError, Trainer

    if any(a in {"-h", "--help"} for a in argv):
        base = get_recipe(argv[0]) if argv and argv[0] in RECIPES else get_recipe("default")
        print(format_help(TrainConfig, prog=PROG + " [RECIPE | recipe.yaml] [--local]", doc=__doc__, base=base))
        return 0
    show = any(a in {"--print_config", "--print-config"} for a in argv)

    def note(text: str) -> None:  # rank 0 only; beside --print_config's YAML, on stderr
        if os.environ.get("RANK", "0") == "0":
            print(text, file=sys.stderr if show else sys.stdout)

    try:
        cfg = resolve_config([a for a in argv if a not in {"--print_config", "--print-config"}], note=note)
        cfg.validate()
    except ConfigError as e:
        fail(PROG, str(e))
    if show:
        import yaml

        print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")
        return 0
    info = run_lock = None
    try:
        check_inputs(cfg)
        init_tok = _init_tokenizer(cfg) if cfg.init_from else None  # a missing source is refused before the lock
        info = init_distributed(cfg.device)
        cfg.validate(world_size=info.world_size)  # again only under torchrun: the ranks are news
        # the run directory's lock before the built-in data is prepared there (the trainer re-enters it)
        lock = hold_run_dir(cfg.output_dir)
        lock.__enter__()
        run_lock = lock
        builtin = BUILTIN in cfg.data
        if builtin:
            data_dir, tok_dir = cfg.output_dir / "data", cfg.output_dir / "data" / "tokenizer"
            if info.is_main:  # the built-in text in the model's tokens, or in --tokenizer's, else a tokenizer of its own
                prepare_builtin_data(cfg.output_dir, tokenizer=init_tok or cfg.tokenizer)
            if info.distributed:
                import torch.distributed as dist

                dist.barrier()
            cfg.data = {(str(data_dir) if k == BUILTIN else k): w for k, w in cfg.data.items()}
            if not cfg.init_from:
                cfg.tokenizer = cfg.tokenizer or str(tok_dir)
        from ..integrations.lm_eval import zero_shot_evaluator

        trainer = Trainer(cfg, info=info, task_evaluator=zero_shot_evaluator(cfg, info=info))
        result = trainer.train()
        if builtin and info.is_main:  # a stop signal raised TrainingInterrupted: `biglm` exits 130 / 143
            _demo_report(trainer, result)
        return 0
    except NonFiniteLossError as e:
        print(f"[biglm] error: {e}", file=sys.stderr)
        return 3
    except (ConfigError, ValueError, KeyError, FileNotFoundError, CheckpointError, ShardError, PrepareError) as e:
        print(f"[biglm] error: {e}", file=sys.stderr)
        return 2
    finally:
        if run_lock is not None:
            run_lock.__exit__(None, None, None)
        if info is not None:
            destroy_distributed()


def _demo_report(trainer, result) -> None:
    """The built-in run's ending: what the model learned against the unigram baseline (`demo.demo_report`)."""
    from .demo import demo_report

    demo_report(trainer, result)


__all__ = ["main", "resolve_config", "RECIPES"]
