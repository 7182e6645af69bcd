"""Every pre-training experiment of the paper as a named recipe (a `TrainConfig`), with the built-in demo and the
recipes that continue from a model: what `biglm pretrain RECIPE` runs and `biglm recipes` lists.

- Table 1 (§2.2): the 124M trial models, BiGLM / w/o attn. / w/o both (plain MLM), 50k steps of 1024 x 2048 tokens
  (~100B), cosine lr 3e-3, FineWeb-edu, with dropout (the paper's Table 2 "BiGLM" row is the Table 1 row, and "w/o
  dropout" improves on it). Table 8 (Appendix C): α ∈ {0.1, 0.3, 0.4}, β_X ranges via (λ1, λ2), β_Y ranges. Table 2
  (§3): w/o dropout, BiGLM++ (the deeper 136M shape), w/ mixdata, and WSD runs with no / raw / raw++ (longer) /
  synthetic / mixed annealing data.
- §4 final models: 136M, 360M, 1.3B, 3.5B; 300k steps, WSD lr 6e-4 -> 6e-5 with 60k (20%) annealing steps,
  FineWeb-edu + Cosmopedia v2 (Table 7). These and Table 1's BiGLM have `-blocks` twins (the `biglm-blocks` objective).
- `table1-micro-*`: Table 1's three variants at micro scale on a CPU: 4 layers x 128, 300 steps of 32 x 128 tokens of
  local English text, the same tokens, schedule and data for all three, no dropout; scripts/table1_micro.sh builds the
  data, runs, evaluates and reports them (``--seed`` gives the seed replicas).
- `default`: the built-in demo, what `biglm pretrain` runs with no recipe: a 4-layer, 192-wide BiGLM on the English
  text of the Python installation (`builtin` data, with its own 4,096-token tokenizer, prepared into OUT/data), 450
  steps of 32 x 128 tokens, a few minutes on a CPU.
- Continued pre-training (``--init_from DIR`` required; the shape and tokenizer are the model's): `blocks-adapt`
  turns a BiGLM or a conversion into a biglm-blocks model that drafts (the default's data and batch; prefix blocks of
  1, 8, 16 and 32, 1 being what one token per call, speculative decoding and the append scorer read; 300 steps at lr
  3e-4, a tenth of the default's as the weights are trained, a 20-step warm-up for the fresh optimizer, cosine to
  3e-5); `biglm-136m-from-smollm` and `biglm-360m-from-smollm` (for a GPU) give a SmolLM checkpoint converted by
  `biglm convert` the paper objective on the final models' data and batch. Chosen, not measured: 20k steps, a 500-step
  warm-up, peak lr 3e-4 (half the from-scratch 6e-4, as Dream and DiffuLLaMA adapt below their pre-training lr), WSD
  decaying over the last 20% to 3e-5; attention switches to BiGLM's at once (the shift and this choice were measured
  at CPU scale: docs/LOG.md).

Not stated in the paper, chosen here and written down: warm-up 2000 steps; min lr of the cosine runs 3e-4 (10%);
dropout 0.1 where the paper used it (Megatron's default); the final-model mixture weights follow the corpora's token
counts in SmolLM-Corpus (FineWeb-edu-dedup ~220B, Cosmopedia v2 ~28B). Data folders are token shards written by
`biglm data prepare`; ``hub_sources`` says which hub dataset builds each, and a missing folder's error prints the
exact command.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
from typing import Callable

from ..config import ConfigError
from ..objective import OBJECTIVES
from .config import BUILTIN, ModelArgs, TrainConfig

FINEWEB = "data/fineweb-edu"
COSMO = "data/cosmopedia-v2"
HUB = {
    FINEWEB: "hf:HuggingFaceTB/smollm-corpus:fineweb-edu-dedup",
    COSMO: "hf:HuggingFaceTB/smollm-corpus:cosmopedia-v2",
}
TOKENIZER = "HuggingFaceTB/SmolLM-135M"  # the 49152-token vocabulary the paper's sizes imply
MIX = {FINEWEB: 220.0, COSMO: 28.0}

_TRIAL = TrainConfig(
    name="table1-biglm", preset="biglm-124m", model=ModelArgs(hidden_dropout=0.1, attention_dropout=0.1),
    objective=OBJECTIVES["biglm"], tokenizer=TOKENIZER, data={FINEWEB: 1.0}, hub_sources=HUB, seq_len=2048,
    global_batch=1024, micro_batch=16, steps=50_000, lr=3e-3, min_lr=3e-4, schedule="cosine", warmup_steps=2000,
    eval_every=1000, save_every=1000,
)
# BiGLM++ (Table 2): the deeper 136M shape, no dropout
_PLUS = dataclasses.replace(_TRIAL, name="table2-biglm-plus", preset="biglm-136m", model=ModelArgs())


def _r(base: TrainConfig, name: str, **changes) -> TrainConfig:
    return dataclasses.replace(base, name=name, **changes)


def _final(preset: str, micro_batch: int) -> TrainConfig:
    return _r(_PLUS, preset, preset=preset, data=dict(MIX), steps=300_000, lr=6e-4, min_lr=6e-5, schedule="wsd",
              anneal_fraction=0.2, micro_batch=micro_batch, save_every=2000, eval_every=2000)


_WSD = dict(schedule="wsd", min_lr=3e-4)
_BIGLM = OBJECTIVES["biglm"]

# the built-in demo: a small model that learns visibly in minutes on a laptop CPU (its cost: docs/LOG.md)
_DEFAULT = TrainConfig(
    name="default", preset="tiny",
    model=ModelArgs(num_hidden_layers=4, hidden_size=192, num_attention_heads=6, num_key_value_heads=2,
                    intermediate_size=512, max_position_embeddings=256),
    objective=_BIGLM, data={BUILTIN: 1.0}, seq_len=128, global_batch=32, micro_batch=32, steps=450, lr=3e-3,
    min_lr=3e-4, schedule="cosine", warmup_steps=30, log_every=25, eval_every=150, eval_windows=256, save_every=150,
    keep_last=2,
)

# Table 1 at micro scale (CPU, ~8 min per run on one shared core); data and tokenizer built by scripts/table1_micro.sh
MICRO_DATA = "data/table1-micro"
MICRO_SOURCES = ("../shared/data/pretrain/tinystories/TinyStories-train.head.txt ../shared/data/pretrain/gutenberg "
                 "../shared/data/pretrain/brown ../shared/data/pretrain/inaugural ../shared/data/pretrain/state_union")
_MICRO = _r(_DEFAULT, "table1-micro-biglm", data={MICRO_DATA: 1.0}, hub_sources={MICRO_DATA: MICRO_SOURCES},
            model=ModelArgs(num_hidden_layers=4, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                            intermediate_size=384, max_position_embeddings=256),
            steps=300, warmup_steps=30, eval_every=75, eval_windows=256, save_every=75, log_every=15)

RECIPES: dict[str, Callable[[], TrainConfig]] = {
    "default": lambda: _DEFAULT,
    # Table 1
    "table1-biglm": lambda: _TRIAL,
    "table1-no-attn": lambda: _r(_TRIAL, "table1-no-attn", objective=OBJECTIVES["biglm-no-attn"]),
    "table1-mlm": lambda: _r(_TRIAL, "table1-mlm", objective=OBJECTIVES["mlm"]),
    # Table 1 at micro scale
    "table1-micro-biglm": lambda: _MICRO,
    "table1-micro-no-attn": lambda: _r(_MICRO, "table1-micro-no-attn", objective=OBJECTIVES["biglm-no-attn"]),
    "table1-micro-mlm": lambda: _r(_MICRO, "table1-micro-mlm", objective=OBJECTIVES["mlm"]),
    # Table 8
    **{f"table8-alpha-{a}": (lambda a=a: _r(_TRIAL, f"table8-alpha-{a}", objective=_BIGLM.replace(alpha=a)))
       for a in (0.1, 0.3, 0.4)},
    **{f"table8-betax-{lo}-{hi}": (lambda lo=lo, hi=hi, lam=lam: _r(_TRIAL, f"table8-betax-{lo}-{hi}",
                                                                   objective=_BIGLM.replace(prefix_lambda=lam)))
       for (lo, hi), lam in {(0.1, 0.5): (0.5, 0.4), (0.3, 0.5): (0.5, 0.2), (0.2, 0.4): (0.4, 0.2)}.items()},
    **{f"table8-betay-{lo}-{hi}": (lambda lo=lo, hi=hi: _r(_TRIAL, f"table8-betay-{lo}-{hi}",
                                                          objective=_BIGLM.replace(suffix_ratio=(lo, hi))))
       for lo, hi in ((0.1, 0.9), (0.2, 0.8), (0.3, 0.7))},
    # Table 2
    "table2-no-dropout": lambda: _r(_TRIAL, "table2-no-dropout", model=ModelArgs()),
    "table2-biglm-plus": lambda: _PLUS,
    "table2-mixdata": lambda: _r(_PLUS, "table2-mixdata", data=dict(MIX)),
    "table2-wsd-no-anneal": lambda: _r(_PLUS, "table2-wsd-no-anneal", **_WSD, anneal_fraction=0.0),
    "table2-wsd-rawdata": lambda: _r(_PLUS, "table2-wsd-rawdata", **_WSD, anneal_fraction=0.1),
    "table2-wsd-rawdata-plus": lambda: _r(_PLUS, "table2-wsd-rawdata-plus", **_WSD, anneal_fraction=0.2),
    "table2-wsd-syndata": lambda: _r(_PLUS, "table2-wsd-syndata", **_WSD, anneal_fraction=0.1, anneal_data={COSMO: 1.0}),
    "table2-wsd-mixdata": lambda: _r(_PLUS, "table2-wsd-mixdata", **_WSD, anneal_fraction=0.1, anneal_data=dict(MIX)),
    # §4 final models (Table 7)
    "biglm-136m": lambda: _final("biglm-136m", 16),
    "biglm-360m": lambda: _final("biglm-360m", 8),
    "biglm-1.3b": lambda: _final("biglm-1.3b", 4),
    "biglm-3.5b": lambda: _r(_final("biglm-3.5b", 2), "biglm-3.5b", activation_checkpointing=True),
}
# `biglm-blocks` twins (the same run with block-cut prefixes, so block decoding's append cache is exact): the Table 1
# comparison and the §4 final models
_BLOCKS = OBJECTIVES["biglm-blocks"]
for _name in ("table1-biglm", "table1-micro-biglm", "biglm-136m", "biglm-360m", "biglm-1.3b", "biglm-3.5b"):
    _twin = _name.replace("-biglm", "") + "-blocks"
    RECIPES[_twin] = (lambda base=RECIPES[_name], twin=_twin: _r(base(), twin, objective=_BLOCKS))

# continued pre-training from an existing model (--init_from required; the shape and tokenizer are the model's)
_ADAPT = dict(model=ModelArgs(), tokenizer=None, requires_init=True)
# blocks of 1 as well: one-token-per-call decoding, speculative decoding and the append scorer read answer tokens as
# blocks of 1 (a converted AR model's own condition); measured free at the real shape (docs/LOG.md)
# draft-tree steps when the data is a teacher's greedy text (`biglm data distill`): its draft slots learn the tokens
# one token per call writes (they raised acceptance there, not on a corpus: docs/LOG.md)
_BLOCKS_ADAPT = dataclasses.replace(_BLOCKS, prefix_blocks=(1, *_BLOCKS.prefix_blocks), draft_tree_every=-1)
RECIPES["blocks-adapt"] = lambda: _r(_DEFAULT, "blocks-adapt", objective=_BLOCKS_ADAPT, steps=300, lr=3e-4, min_lr=3e-5,
                                     warmup_steps=20, eval_every=100, save_every=100, **_ADAPT)
for _size, _mb in (("136m", 16), ("360m", 8)):
    RECIPES[f"biglm-{_size}-from-smollm"] = (
        lambda size=_size, mb=_mb: _r(_final(f"biglm-{size}", mb), f"biglm-{size}-from-smollm", objective=_BIGLM,
                                      steps=20_000, warmup_steps=500, lr=3e-4, min_lr=3e-5, anneal_fraction=0.2,
                                      attention_anneal_steps=0, save_every=1000, eval_every=1000, **_ADAPT))

# `--local`: the same recipe shrunk to a few minutes on a laptop (fewer steps, smaller batch, shorter windows)
LOCAL = dict(steps=200, global_batch=8, micro_batch=8, seq_len=256, warmup_steps=20, eval_every=50, eval_windows=32,
             save_every=100, log_every=10)


def get_recipe(name: str, *, local: bool = False) -> TrainConfig:
    """The named recipe (a fresh copy); ``local=True`` applies the `LOCAL` shrink."""
    if name not in RECIPES:
        close = difflib.get_close_matches(name, list(RECIPES), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"unknown recipe {name!r}{hint}; `biglm recipes` lists them, or give a .yaml file")
    cfg = copy.deepcopy(RECIPES[name]())
    if local:
        cfg = dataclasses.replace(cfg, **LOCAL)
    return cfg
