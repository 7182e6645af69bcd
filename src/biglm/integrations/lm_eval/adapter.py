"""lm-evaluation-harness (0.4.13) model ``biglm``: a BiGLM scored with the estimators of `biglm.scoring.estimators`.

Notable features
- Registered with ``@register_model("biglm")`` when this module is imported; lm-eval has no plugin
  discovery, so the runners (`biglm.integrations.lm_eval.harness`) import it before calling lm-eval.
- ``loglikelihood`` groups requests by identical context: each context is encoded once and its cache
  is shared by all the choices of a question (and by every variant an estimator needs).
- Tokenisation follows HFLM: trailing spaces of the context move to the continuation, and the
  continuation's ids are the tail of the encoded context+continuation, so a word's leading space
  and the BPE merges across the boundary come out as in running text.
- ``prefix_token=auto`` (the default): a BiGLM trained by biglm gets a document-boundary token before every
  context (the pre-training shards end each document with ``</s>``, so a new document follows ``</s>``); a
  model converted from an autoregressive checkpoint (``shift_logits``) gets nothing, as lm-eval's ``hf`` model
  scores its source, and an empty context alone gets BOS (EOS without one: HFLM's rule). A tokenizer with a
  chat template is said once: contexts are scored as plain text, as lm-eval's ``hf`` model does without
  ``--apply_chat_template``.
- ``generate_until`` conditions on exactly the ids ``loglikelihood`` scores against
  (`BiGLMLM._encode_context`: the prefix token, trailing whitespace moved out of the context,
  truncation from the left by the same `fit_window` rule); the moved whitespace is taken off the
  front of the answer, so the answer continues the context as written.
- ``scorer=auto`` scores an answer as the model's one-token-per-call decoding writes it: ``append`` (under the cache
  that decoding runs, `biglm.scoring.estimators.append_cache`: the append cache for a `biglm-blocks` model, the
  re-encoded exact one otherwise, or ``block_cache`` from model_args, which ``generate_until`` decodes with too) for
  a blocks model trained on blocks of 1 and for a model converted from an AR checkpoint, ``chain`` for every other
  BiGLM. The resolved scorer and its cache go into lm-eval's results (``config.biglm_scorer``,
  ``config.biglm_score_cache``: `BiGLMLM.get_model_info`) and `biglm eval` prints them.
- Decoding options are one `DecodingConfig`: model_args may set defaults (``steps``, ``strategy``,
  ``early_stop``, ``temperature``... and ``max_gen_toks``), each request's gen_kwargs override them
  (`decoding_from_gen_kwargs`); an unknown gen_kwarg is refused, naming the accepted ones. The default
  is the published Mask-Predict (T model calls); ``early_stop=true`` is opt-in.
- Data parallel: under ``torchrun`` / ``accelerate launch`` (WORLD_SIZE > 1) each process evaluates
  its shard of the documents (lm-eval splits them by ``rank``/``world_size``) and the gathers go
  through torch.distributed (gloo on CPU, nccl on CUDA), as HFLM does through accelerate. The process
  group is started by `biglm.training.distributed.init_distributed`, the one place that starts them.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from tqdm import tqdm

from ...generation import DecodingConfig, generate_from_ids
from ...generation.config import FIELDS as DECODING_FIELDS
from ...scoring.estimators import (ESTIMATORS, append_cache, default_estimator, fit_window, score_requests,
                                  score_rolling)

log = logging.getLogger(__name__)

DEFAULT_SCORER = "auto"  # `default_estimator`: append for a blocks model trained on blocks of 1 or a converted one

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


# decoding defaults that model_args may set (max_gen_toks is lm-eval's name for max_new_tokens, seed is
# shared with the mc estimator; stop strings come per request, as ``until``)
MODEL_ARG_DECODING = tuple(f for f in DECODING_FIELDS if f not in ("max_new_tokens", "seed", "stop"))
# lm-eval's generation keys (HFLM's names) and biglm's own decoding options
GEN_KWARGS = ("until", "max_gen_toks", "do_sample", "temperature", "top_k", "top_p", "steps", "strategy",
              "early_stop", "block_length", "length_beam", "threshold", "seed", "use_cache")


def decoding_from_gen_kwargs(base: DecodingConfig, gen_kwargs: dict[str, Any]) -> DecodingConfig:
    """``base`` (the model_args defaults) with one request's lm-eval gen_kwargs applied, validated.

    - ``until`` -> ``stop``; ``max_gen_toks`` -> ``max_new_tokens``.
    - ``do_sample=False`` is greedy whatever the temperature (HF semantics). ``do_sample=True`` without a
      temperature samples at the base temperature, or at 1.0 (HF's default) when that is greedy;
      ``do_sample=True`` with ``temperature=0`` is refused, as HF refuses it: the two contradict.
    - ``top_k`` 0 or -1 means no top-k filter (HF's and vLLM's spelling of "off").
    - Any other key is refused with a ValueError naming it and the accepted keys.
    """
    kw = dict(gen_kwargs)
    unknown = sorted(set(kw) - set(GEN_KWARGS))
    if unknown:
        raise ValueError(f"biglm generate_until: unsupported gen_kwargs {', '.join(map(repr, unknown))}; "
                         f"accepted: {', '.join(GEN_KWARGS)}.")
    changes: dict[str, Any] = {}
    if "until" in kw:
        until = kw.pop("until")
        changes["stop"] = [until] if isinstance(until, str) else list(until or [])
    if "max_gen_toks" in kw:
        changes["max_new_tokens"] = kw.pop("max_gen_toks")
    do_sample = kw.pop("do_sample", None)
    if do_sample is not None and not isinstance(do_sample, bool):
        raise ValueError(f"biglm generate_until: do_sample={do_sample!r} must be true or false.")
    if kw.get("top_k") in (0, -1):
        kw["top_k"] = None
    if do_sample is False:
        kw["temperature"] = 0.0
    elif do_sample is True:
        if "temperature" not in kw:
            kw["temperature"] = base.temperature if base.temperature > 0 else 1.0
        elif kw["temperature"] == 0:
            raise ValueError("biglm generate_until: do_sample=True with temperature=0 contradict each other: set "
                             "temperature > 0 to sample (HF's default is 1.0) or do_sample=False for greedy decoding.")
    try:
        return base.override(**changes, **kw)
    except ValueError as e:
        raise ValueError(f"biglm generate_until: gen_kwargs {gen_kwargs}: {e}") from None


def _as_int(value: Any, default: int) -> int:
    """lm-eval passes batch sizes as str ("8", "auto", "auto:4") or int; "auto" means our default."""
    if value is None or (isinstance(value, str) and value.startswith("auto")):
        return default
    return int(value)


class ModelArgsError(ValueError):
    """A ``--model_args`` value the adapter refuses (one line naming it); `biglm eval` prints it as such."""


@register_model("biglm")
class BiGLMLM(LM):
    """A BiGLM as an lm-eval model.

    Args (``--model_args key=value,...``):
        pretrained: directory written by `biglm export` / ``save_pretrained`` (or a training checkpoint
            that `biglm.checkpoint.load_model` accepts).
        scorer: ``auto`` | ``chain`` | ``one-pass`` | ``pll`` | ``mc`` | ``blocks`` | ``append`` (see
            `biglm.scoring.estimators`; auto, `default_estimator`: ``append`` for a `biglm-blocks` model trained on
            blocks of 1 and for a model converted from an AR checkpoint (shift_logits), else ``chain``). ``append``
            is the distribution one-token-per-call decoding writes from, under the cache that decoding runs for the
            model (`append_cache`: append for a blocks model, exact otherwise; ``block_cache`` below overrides it
            for both), so the score of a greedy answer is the log-probability its decoding assigned it.
        batch_size: contexts encoded per batch (``auto`` = 16).
        row_batch_size: suffix rows per forward pass.
        device: ``cpu``, ``cuda``, ``cuda:1``... (under torchrun: ``cuda:LOCAL_RANK``).
        dtype: ``float32`` | ``bfloat16`` | ``float16`` (default: the checkpoint's).
        max_length: window in tokens (default: the model's max_position_embeddings).
        mc_samples: Monte Carlo samples per request for ``scorer=mc``.
        score_block: tokens per block for ``scorer=blocks``.
        seed: seed of the ``mc`` estimator.
        rolling_chunk: tokens predicted per window by ``loglikelihood_rolling``.
        prefix_token: ``auto`` | ``eos`` | ``bos`` | ``none``: the token put before every context (auto: none for a
            model converted from an AR checkpoint, eos otherwise).
        max_gen_toks: default generation length for ``generate_until``.
        steps, strategy, temperature, top_k, top_p, length_beam, block_length, block_cache, threshold,
            early_stop, use_cache: default decoding for ``generate_until`` (`DecodingConfig` fields; a request's
            gen_kwargs override them). ``seed`` also seeds the sampler.
    """

    def __init__(
        self,
        pretrained: str,
        scorer: str = DEFAULT_SCORER,
        batch_size: int | str | None = 16,
        max_batch_size: int | None = None,
        row_batch_size: int = 256,
        device: str | None = None,
        dtype: str | None = None,
        max_length: int | None = None,
        mc_samples: int = 32,
        score_block: int = 8,
        seed: int = 1234,
        rolling_chunk: int = 32,
        prefix_token: str = "auto",
        max_gen_toks: int = 64,
        _in_memory: tuple[Any, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        decoding = {k: kwargs.pop(k) for k in MODEL_ARG_DECODING if k in kwargs}
        if kwargs:  # every model_arg takes effect or is refused: a typo must not be ignored
            import difflib
            import inspect

            known = [n for n in inspect.signature(type(self).__init__).parameters
                     if n not in {"self", "kwargs"} and not n.startswith("_")]
            known += list(MODEL_ARG_DECODING)
            hints = [f"{k} (did you mean {c[0]}?)" if (c := difflib.get_close_matches(k, known, n=1)) else k
                     for k in sorted(kwargs)]
            raise ModelArgsError(f"biglm: unknown model_args {', '.join(hints)}; accepted: {', '.join(known)}")
        # checked now, before the model loads and before any request runs
        try:
            self.decoding = DecodingConfig(max_new_tokens=int(max_gen_toks), seed=int(seed), **decoding)
        except ValueError as e:
            raise ModelArgsError(f"biglm model_args: {e}") from None
        if scorer != "auto" and scorer not in ESTIMATORS:
            raise ModelArgsError(f"scorer={scorer!r}: choose auto or one of {', '.join(ESTIMATORS)}.")
        if int(score_block) < 1:
            raise ModelArgsError(f"score_block={score_block}: must be >= 1 (tokens per block of scorer=blocks).")
        if dtype is not None and str(dtype) not in _DTYPES:
            raise ModelArgsError(f"dtype={dtype!r}: choose one of {', '.join(_DTYPES)}.")
        if _in_memory is not None:  # `from_model`: this process alone, on the model's own device and dtype
            self.model, self.tokenizer = _in_memory
            self._device = next(self.model.parameters()).device
        else:
            self._init_distributed(device)
            from ...checkpoint import load_model

            self.model, self.tokenizer = load_model(pretrained, device=self._device,
                                                    dtype=_DTYPES[str(dtype)] if dtype is not None else None, pack=True)
        self.pretrained = str(pretrained)
        self.scorer = default_estimator(self.model.config) if scorer == "auto" else scorer
        # append scores under the cache generate_until's one-token-per-call decoding runs (speculative: append)
        self.score_cache = append_cache(self.model.config,
                                        "append" if self.decoding.draft_length else self.decoding.block_cache)
        if scorer == "auto":
            log.info("biglm: scorer=auto -> %s", self.scorer_name)
        self.batch_size = _as_int(batch_size, 16)
        self.row_batch_size = int(row_batch_size)
        self.mc_samples = int(mc_samples)
        self.score_block = int(score_block)
        self.seed = int(seed)
        self.rolling_chunk = int(rolling_chunk)
        self._max_length = int(max_length or self.model.config.max_position_embeddings)
        if self._max_length > self.model.config.max_position_embeddings:
            raise ModelArgsError(f"max_length={self._max_length} exceeds the model's max_position_embeddings="
                                 f"{self.model.config.max_position_embeddings}.")
        choices = {"eos": self.tokenizer.eos_token_id, "bos": self.tokenizer.bos_token_id, "none": None}
        if prefix_token == "auto":
            prefix_token = "none" if getattr(self.model.config, "shift_logits", False) else "eos"
        if prefix_token not in choices:
            raise ModelArgsError(f"prefix_token={prefix_token!r}: choose auto, eos, bos or none.")
        self.prefix_token = prefix_token
        self.prefix_ids = [] if choices[prefix_token] is None else [int(choices[prefix_token])]
        if getattr(self.tokenizer, "chat_template", None) and self.rank == 0:
            log.warning("biglm: the tokenizer has a chat template; contexts are scored as plain text without "
                                "it (as lm-eval's hf model without --apply_chat_template)")

    @property
    def scorer_name(self) -> str:
        """The resolved scorer as results name it: ``append`` with its cache (``append (exact cache)``), else as is."""
        return f"{self.scorer} ({self.score_cache} cache)" if self.scorer == "append" else self.scorer

    def get_model_info(self) -> dict[str, Any]:
        """What lm-eval adds to its results' ``config`` (and writes into the results JSON): the resolved scorer."""
        return {"biglm_scorer": self.scorer,
                "biglm_score_cache": self.score_cache if self.scorer == "append" else None}

    @classmethod
    def from_model(cls, *, model: Any, tokenizer: Any, **model_args: Any) -> "BiGLMLM":
        """The same lm-eval model around a BiGLM already in memory (in-training evaluation): no loading, one
        process (rank 0 of 1, whatever the launcher), the model's device and dtype; ``model_args`` as above."""
        if "pretrained" in model_args or "device" in model_args or "dtype" in model_args:
            raise ValueError("from_model: pretrained, device and dtype come from the model itself.")
        return cls(pretrained=getattr(model.config, "_name_or_path", "") or "in-memory", _in_memory=(model, tokenizer),
                   **model_args)

    # ---- process layout --------------------------------------------------------------------------------

    def _init_distributed(self, device: str | None) -> None:
        """Set rank/world size from the launcher's env (torchrun and accelerate both set RANK/WORLD_SIZE)."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if device is not None and str(device).startswith("cuda") and not torch.cuda.is_available():
            # lm-eval's CLI defaults to --device cuda; a CPU machine should still run
            log.warning("biglm: device %s requested but CUDA is not available; using cpu", device)
            device = "cpu"
        want_cuda = device is not None and str(device).startswith("cuda") or (device is None and torch.cuda.is_available())
        if world > 1:  # the launcher's process group (nccl on CUDA, gloo on CPU), one device per local rank
            from ...training.distributed import init_distributed

            info = init_distributed("cuda" if want_cuda else "cpu")
            self._rank, self._world_size, self._device = info.rank, info.world_size, info.device
        else:
            self._device = torch.device(device if device is not None else ("cuda" if want_cuda else "cpu"))

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        if self._world_size == 1:
            return tensor
        import torch.distributed as dist

        parts = [torch.empty_like(tensor) for _ in range(self._world_size)]
        dist.all_gather(parts, tensor.contiguous())
        return torch.stack(parts) if tensor.dim() == 0 else torch.cat(parts)

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
        if self._world_size == 1:
            return [obj]
        import torch.distributed as dist

        out = [None] * self._world_size if self._rank == dst else None
        dist.gather_object(obj, out, dst=dst)
        return out

    def barrier(self) -> None:
        if self._world_size > 1:
            import torch.distributed as dist

            dist.barrier()

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        return self.decoding.max_new_tokens

    @property
    def tokenizer_name(self) -> str:
        return getattr(self.tokenizer, "name_or_path", "biglm").replace("/", "__")

    # ---- tokenisation ----------------------------------------------------------------------------------

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _encode_context(self, context: str) -> tuple[list[int], str]:
        """``(ids, moved)``: the context's ids as both ``loglikelihood`` and ``generate_until`` condition on
        them (the prefix token, then the context without its trailing whitespace), and that whitespace.

        As HFLM: in "Question: x? Answer:" + " yes" the space belongs to the continuation, so it is
        moved out of the context here; a scored continuation gets it in front, a generated answer is
        expected to produce it.
        """
        text = context.rstrip()
        ids = self._encode(text)
        if not ids and not self.prefix_ids and self._hf_prefix_token() is not None:
            return [self._hf_prefix_token()], context[len(text):]  # something to attend to (HFLM's rule)
        return self.prefix_ids + ids, context[len(text):]

    def _hf_prefix_token(self) -> int | None:
        """What lm-eval's hf model puts before an empty context or a rolling text: BOS when the tokenizer has one,
        else EOS (`HFLM.prefix_token_id`)."""
        bos, eos = self.tokenizer.bos_token_id, self.tokenizer.eos_token_id
        return int(bos) if bos is not None else None if eos is None else int(eos)

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        ids, moved = self._encode_context(context)
        context, continuation = context[:len(context) - len(moved)], moved + continuation
        ctx = ids[len(self.prefix_ids):]
        whole = self._encode(context + continuation)
        cont = whole[len(ctx):]
        if not cont or whole[:len(ctx)] != ctx:
            # the merge crossed the boundary: encode separately so the continuation is still scored whole
            cont = self._encode(continuation)
        return ids, cont

    def _generation_prompt(self, context: str, max_new_tokens: int) -> tuple[list[int], str, bool]:
        """``(ids, moved, truncated)``: `_encode_context`, cut from the left to leave room for the answer by the
        rule that fits a scored continuation (`fit_window`)."""
        if max_new_tokens > self._max_length:
            raise ValueError(f"biglm generate_until: max_gen_toks={max_new_tokens} does not fit the {self._max_length}"
                             "-token window (max_length): lower max_gen_toks.")
        ids, moved = self._encode_context(context)
        ids, dropped = fit_window(ids, range(max_new_tokens), max_length=self._max_length)
        return ids, moved, dropped > 0

    # ---- lm-eval requests ------------------------------------------------------------------------------

    def loglikelihood(self, requests: list, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = [req.args for req in requests]
        encoded = []
        for context, continuation in pairs:
            if not continuation:
                raise ValueError(f"empty continuation for context {context[-80:]!r}: nothing to score.")
            encoded.append(self._encode_pair(context, continuation))
        # chunks of whole contexts, so a context's choices are scored together (one encode each)
        by_ctx: dict[tuple[int, ...], list[int]] = {}
        for i, (ctx, _) in enumerate(encoded):
            by_ctx.setdefault(tuple(ctx), []).append(i)
        order = sorted(by_ctx, key=len, reverse=True)
        results: list[tuple[float, bool] | None] = [None] * len(encoded)
        step = self.batch_size * 4
        bar = tqdm(total=len(encoded), disable=disable_tqdm or self.rank != 0, desc=f"biglm {self.scorer_name}")
        # one truncation warning for the whole call, not one per chunk
        too_long = sum(len(c) + len(k) > self._max_length for c, k in encoded)
        if too_long:
            warnings.warn(f"{too_long} of {len(encoded)} requests exceed the {self._max_length}-token window: their "
                          "contexts are truncated from the left (the continuation is kept whole).", stacklevel=2)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".* requests exceed the \d+-token window")
            for c0 in range(0, len(order), step):
                idx = [i for c in order[c0:c0 + step] for i in by_ctx[c]]
                scores = score_requests(self.model, [encoded[i] for i in idx], estimator=self.scorer,
                                        batch_size=self.batch_size, row_batch_size=self.row_batch_size,
                                        mc_samples=self.mc_samples, seed=self.seed, max_length=self._max_length,
                                        score_block=self.score_block, block_cache=self.score_cache)
                for i, s in zip(idx, scores):
                    results[i] = s
                    self.cache_hook.add_partial("loglikelihood", pairs[i], s)
                bar.update(len(idx))
        bar.close()
        return results  # type: ignore[return-value]

    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
        prefix = self.prefix_ids[0] if self.prefix_ids else self._hf_prefix_token()
        out = []
        for req in tqdm(requests, disable=disable_tqdm or self.rank != 0, desc=f"biglm rolling {self.scorer_name}"):
            (text,) = req.args
            ll = score_rolling(self.model, [self._encode(text)], prefix_token=int(prefix), estimator=self.scorer,
                               chunk=min(self.rolling_chunk, self._max_length - 1), max_length=self._max_length,
                               batch_size=self.batch_size, row_batch_size=self.row_batch_size,
                               mc_samples=self.mc_samples, seed=self.seed, score_block=self.score_block,
                               block_cache=self.score_cache)[0]
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), ll)
            out.append(ll)
        return out

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        out: list[str | None] = [None] * len(requests)
        groups: dict[str, list[int]] = {}
        for i, req in enumerate(requests):
            groups.setdefault(repr(sorted(req.args[1].items())), []).append(i)
        # every request's options are checked before the first one is generated
        configs = {key: decoding_from_gen_kwargs(self.decoding, requests[idx[0]].args[1]) for key, idx in groups.items()}
        truncated = 0
        for key, idx in groups.items():
            config = configs[key]
            for b0 in tqdm(range(0, len(idx), self.batch_size), disable=disable_tqdm or self.rank != 0,
                           desc="biglm generate"):
                chunk = idx[b0:b0 + self.batch_size]
                prompts = [self._generation_prompt(requests[i].args[0], config.max_new_tokens) for i in chunk]
                truncated += sum(t for _, _, t in prompts)
                texts = generate_from_ids(self.model, self.tokenizer, [p for p, _, _ in prompts], config=config,
                                          moved_whitespace=[m for _, m, _ in prompts])
                for i, text in zip(chunk, texts):
                    out[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
        if truncated:
            warnings.warn(f"{truncated} of {len(requests)} generate_until prompts exceed the {self._max_length}-token "
                          "window beside their answer: truncated from the left.", stacklevel=2)
        return out  # type: ignore[return-value]
