"""`biglm pretrain [RECIPE | recipe.yaml] [--local] [--field value ...]`

Pre-train a BiGLM. RECIPE is a name from `biglm recipes` or a YAML/JSON file of TrainConfig fields;
``--local`` shrinks a paper recipe to a few minutes (fewer steps, smaller batch, shorter windows).
Any TrainConfig field can be overridden: ``--steps 1000 --lr 1e-3 --data data/fineweb-edu``, model
fields as ``--model.hidden_dropout 0.1``, objective fields as ``--objective.alpha 0.3``.

With no RECIPE, the built-in default: a small BiGLM trained on English text every Python
installation carries (its documentation topics and standard-library docstrings, read at run time),
with a tokenizer trained on the spot; no network, about five minutes on 2 CPU cores. It ends by
comparing the validation loss with a unigram baseline and showing what the model fills in for a
few masked sentences.

The same command runs on many processes: ``torchrun --nproc_per_node N -m biglm pretrain RECIPE``.
A run resumes from its newest checkpoint when started again with the same output directory.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from .config import TrainConfig, load_recipe_file
from .recipes import RECIPES, get_recipe

DEFAULT_DIR = Path("runs/default")
# a small model that learns visibly in ~4 minutes on 2 CPU cores (measured: see docs/LOG.md)
DEFAULT = TrainConfig(
    name="default", preset="tiny",
    model=dict(num_hidden_layers=4, hidden_size=192, num_attention_heads=6, num_key_value_heads=2,
               intermediate_size=512, max_position_embeddings=256),
    objective="biglm", seq_len=128, global_batch=32, micro_batch=32, steps=600, lr=3e-3, min_lr=3e-4,
    schedule="cosine", warmup_steps=40, log_every=20, eval_every=100, eval_batches=8, save_every=100, keep_last=2,
)
DEFAULT_VOCAB = 4096

DEMO_SENTENCES = [
    "Return the number of <mask> in the list.",
    "If the file does not exist, an <mask> is raised.",
    "This module provides functions for working with regular <mask>.",
    "The default value is <mask>.",
]


def _help() -> str:
    fields = []
    for f in dataclasses.fields(TrainConfig):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        fields.append(f"  --{f.name:<26} (default: {default!r})")
    return __doc__ + "\nOptions (TrainConfig fields):\n" + "\n".join(fields) + "\n"


def prepare_default_data(out: Path) -> tuple[Path, Path]:
    """Tokenizer and shards of the built-in corpus under ``out/data`` (reused when already built)."""
    from ..data import builtin_corpus, prepare, train_tokenizer

    data_dir = out / "data"
    tok_dir = data_dir / "tokenizer"
    if not (tok_dir / "tokenizer.json").exists():
        print(f"[biglm] training a {DEFAULT_VOCAB}-token byte-level BPE tokenizer on the built-in corpus -> {tok_dir}")
        train_tokenizer(texts=builtin_corpus(), vocab_size=DEFAULT_VOCAB, out_dir=str(tok_dir))
    prepare(sources=["builtin"], tokenizer=str(tok_dir), out_dir=data_dir, val_docs=60, workers=None)
    return data_dir, tok_dir


def show_fill_ins(model, tokenizer, sentences: list[str], *, top_k: int = 3) -> list[list[str]]:
    """What the model predicts at each <mask> (full bidirectional attention), printed and returned."""
    import torch

    model.eval()
    results = []
    device = next(model.parameters()).device
    for text in sentences:
        text = text.replace("<mask>", tokenizer.mask_token)
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"].to(device)
        with torch.no_grad():
            logits = model(ids).logits[0]
        where = (ids[0] == tokenizer.mask_token_id).nonzero().flatten()
        guesses = []
        for pos in where.tolist():
            top = logits[pos].topk(top_k).indices.tolist()
            guesses.append(" / ".join(repr(tokenizer.decode([t]).strip()) for t in top))
        results.append(guesses)
        print(f"  {text}\n    -> {', '.join(guesses)}")
    return results


def main(argv: list[str]) -> int:
    from ..data.shards import ShardError
    from .checkpoint import CheckpointError
    from .distributed import destroy_distributed, init_distributed
    from .trainer import NonFiniteLossError, Trainer

    if any(a in {"-h", "--help"} for a in argv):
        print(_help())
        return 0
    local = "--local" in argv
    argv = [a for a in argv if a != "--local"]
    builtin_default = not argv or argv[0].startswith("--")
    try:
        if builtin_default:
            cfg = dataclasses.replace(DEFAULT, model=dict(DEFAULT.model)).override(argv)
            out = cfg.output_dir if cfg.out_dir else DEFAULT_DIR
            cfg.out_dir = str(out)
            info = init_distributed(cfg.device)
            if info.is_main:
                data_dir, tok_dir = prepare_default_data(out)
            if info.distributed:
                import torch.distributed as dist

                dist.barrier()
            data_dir, tok_dir = out / "data", out / "data" / "tokenizer"
            cfg.data, cfg.tokenizer = {str(data_dir): 1.0}, str(tok_dir)
        else:
            name, rest = argv[0], argv[1:]
            if Path(name).suffix in {".yaml", ".yml", ".json"}:
                cfg = load_recipe_file(name).override(rest)
            else:
                cfg = get_recipe(name, local=local).override(rest)
            info = init_distributed(cfg.device)
        trainer = Trainer(cfg, info=info)
        result = trainer.train()
        if builtin_default and info.is_main and not result.interrupted:
            from .data import unigram_loss

            base = unigram_loss(cfg, vocab_size=len(trainer.tokenizer), fingerprint=trainer.data_fingerprint,
                                targets=[batch.labels for _, batch in trainer.val_batches()])
            if result.val_losses:
                val = result.val_losses[-1][1]
            else:  # the run was already complete: evaluate the checkpoint it resumed from
                print(f"[biglm] {cfg.output_dir} already holds the finished run (step {result.step}); "
                      "delete it or pass --out_dir to train again")
                val = trainer.validate()
            print(f"\n[biglm] validation loss {val:.3f} vs unigram baseline {base:.3f} "
                  f"({'below' if val < base else 'NOT below'} the baseline)")
            print("[biglm] what the model fills in:")
            show_fill_ins(trainer.raw_model, trainer.tokenizer, DEMO_SENTENCES)
            print(f"\n[biglm] run directory: {cfg.output_dir}; export with `biglm export {cfg.output_dir} OUT_DIR`, "
                  f"write with `biglm generate {cfg.output_dir} --prompt ...`")
        return 0
    except NonFiniteLossError as e:
        print(f"[biglm] error: {e}", file=sys.stderr)
        return 3
    except (ValueError, KeyError, FileNotFoundError, CheckpointError, ShardError) as e:
        print(f"[biglm] error: {e}", file=sys.stderr)
        return 2
    finally:
        destroy_distributed()


__all__ = ["main", "DEFAULT", "RECIPES"]
