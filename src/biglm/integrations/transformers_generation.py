"""Generation the transformers way: ``model.generate(input_ids, ...)`` on a loaded BiGLM and
``pipeline("text-generation", model=EXPORT)``, both through biglm's own decoding.

A BiGLM does not write left to right, so transformers' `GenerationMixin` (a next-token loop over a KV cache) cannot
drive it. As Dream's remote code does, the model has a ``diffusion_generate`` (and ``generate``, the same) that runs
`biglm.generation.decoding.generate_ids` with the model's decoding settings (`model_decoding`: what `biglm generate`,
`biglm chat` and `biglm serve` decode it with) under the options given, `DecodingConfig`'s fields: ``steps``,
``strategy``, ``temperature``... and transformers' ``do_sample`` and a ``GenerationConfig``'s fields that mean the
same. The ids it returns are transformers': the prompt, then each answer up to its end-of-text token, padded with the
pad id to the longest answer.

The pipeline writes what `biglm generate` prints: `biglm.generation.api.generate` encodes the prompt (no special
tokens, cut from the left to fit), decodes it and cuts the answer at EOS and at the stop strings. A chat (a list of
``{"role", "content"}`` messages) is rendered by the model's chat template as `biglm chat` does. ``import biglm``
makes ``pipeline("text-generation")`` build `TextGenerationPipeline` for BiGLM models and transformers' own pipeline
for every other model.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.pipelines.base import Pipeline
from transformers.pipelines.text_generation import TextGenerationPipeline as _TransformersTextGeneration

from ..generation.api import encode_prompts, generate
from ..generation.chat import render_chat
from ..generation.config import FIELDS, DecodingConfig, model_decoding
from ..generation.decoding import generate_ids, left_pad
from ..model import BiGLMForMaskedLM

__all__ = ["TextGenerationPipeline", "diffusion_generate", "decoding_for"]

# transformers' GenerationConfig fields that mean what a DecodingConfig field means (do_sample is mapped apart)
_SAME = ("max_new_tokens", "temperature", "top_k", "top_p")
_IGNORED = {"transformers_version", "_from_model_config", "pad_token_id", "eos_token_id", "bos_token_id"}


def decoding_for(model: torch.nn.Module, config: Any = None, **options: Any) -> DecodingConfig:
    """The `DecodingConfig` of a call: the model's decoding settings (`model_decoding`), or ``config`` (a
    `DecodingConfig`, or a transformers ``GenerationConfig`` whose fields mean the same), under ``options``
    (`DecodingConfig` fields, and transformers' ``do_sample``: false is greedy, true without a temperature samples at
    1.0, transformers' default). Anything else is refused naming what is accepted."""
    options = dict(options)
    if config is not None and not isinstance(config, DecodingConfig):
        given = {k: v for k, v in config.to_diff_dict().items() if k not in _IGNORED}
        unknown = sorted(set(given) - set(_SAME) - {"do_sample", "stop_strings"})
        if unknown:
            raise ValueError(f"generation_config sets {', '.join(unknown)}, which a BiGLM's decoding has no "
                             f"counterpart for; it reads {', '.join(_SAME)}, do_sample and stop_strings (or pass a biglm "
                             "DecodingConfig, or its fields as keywords)")
        if "stop_strings" in given:
            given["stop"] = given.pop("stop_strings")
        options = {**given, **options}
        config = None
    if "num_return_sequences" in options:
        if options.pop("num_return_sequences") not in (None, 1):
            raise ValueError("num_return_sequences: a BiGLM writes one answer per prompt here (num_return_sequences=1)")
    do_sample = options.pop("do_sample", None)
    if do_sample is False:
        options["temperature"] = 0.0
    elif do_sample is True and not options.get("temperature"):
        options["temperature"] = 1.0
    unknown = sorted(set(options) - set(FIELDS))
    if unknown:
        raise ValueError(f"unknown generation option(s) {', '.join(unknown)}: a BiGLM decodes with biglm's options "
                         f"({', '.join(FIELDS)}) and transformers' do_sample")
    return config.override(**options) if config is not None else model_decoding(model.config, options)


def diffusion_generate(model: torch.nn.Module, inputs: torch.Tensor | None = None, *,
                       input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                       generation_config: Any = None, tokenizer: Any = None, **options: Any) -> torch.LongTensor:
    """``model.generate`` / ``model.diffusion_generate``: answers for the prompts ``input_ids`` (B, P) (padded on
    either side where ``attention_mask`` is 0) by biglm's iterative unmasking; returns (B, P + n) ids, each prompt as
    given followed by its answer (cut after its EOS, then the pad id). ``tokenizer``, when given, keeps ids past its
    vocabulary out of the answers, as `biglm generate` does (a model vocabulary padded for speed)."""
    if inputs is not None and input_ids is not None:
        raise ValueError("give the prompts once: inputs or input_ids")
    ids = inputs if inputs is not None else input_ids
    if not isinstance(ids, torch.Tensor) or ids.ndim != 2 or ids.shape[0] == 0:
        raise ValueError("input_ids must be a (batch, length) tensor of token ids "
                         "(tokenizer(..., return_tensors='pt'))")
    cfg = decoding_for(model, generation_config, **options)
    if cfg.stop:
        raise ValueError("stop strings cut the answer's text: pass them to pipeline('text-generation') "
                         "(stop_sequence=) or biglm.generation.generate (stop=); model.generate returns ids")
    mask = torch.ones_like(ids) if attention_mask is None else attention_mask
    prompts = [row[m.bool()].tolist() for row, m in zip(ids.cpu(), mask.cpu())]
    config = model.config
    pad = config.pad_token_id if config.pad_token_id is not None else 0
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = left_pad(prompts, pad_id=pad, device=device)
    extra = list(range(len(tokenizer), config.vocab_size)) if tokenizer is not None else []
    out = generate_ids(model, prompt_ids, prompt_mask, config=cfg, suppress_ids=extra)
    answers = []
    for row, n in zip(out.tokens.tolist(), out.lengths.tolist()):
        ended = n < len(row) and config.eos_token_id is not None and row[n] == config.eos_token_id
        answers.append(row[:n] + [config.eos_token_id] * ended)
    width = max(len(a) for a in answers)
    tail = torch.full((len(answers), width), pad, dtype=ids.dtype, device=ids.device)
    for i, a in enumerate(answers):
        tail[i, :len(a)] = torch.tensor(a, dtype=ids.dtype)
    return torch.cat([ids, tail], dim=1)


class TextGenerationPipeline(Pipeline):
    """``pipeline("text-generation", model=EXPORT)``: ``gen("Once upon a time")`` ->
    ``[{"generated_text": PROMPT + ANSWER}]`` (``return_full_text=False``: the answer alone, as `biglm generate`
    prints it; ``return_tensors=True``: ``generated_token_ids``, `diffusion_generate`'s row). A list of prompts gives
    a list of such lists; a chat gives the messages with the assistant's answer appended.

    Options: `DecodingConfig`'s fields (``max_new_tokens``, ``steps``, ``strategy``, ``temperature``, ``seed``,
    ``stop``...; defaults: the model's decoding settings, those of `biglm generate`), and transformers'
    ``do_sample``, ``stop_sequence`` (``stop``) and ``num_return_sequences=1``. Built for BiGLM models; for any other
    model, transformers' own text-generation pipeline is built instead."""

    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    def __new__(cls, *args: Any, **kwargs: Any):
        model = kwargs.get("model", args[0] if args else None)
        if cls is TextGenerationPipeline and not isinstance(model, BiGLMForMaskedLM):
            return _TransformersTextGeneration(*args, **kwargs)
        return super().__new__(cls)

    def _sanitize_parameters(self, return_full_text: bool | None = None, return_tensors: bool | None = None,
                             stop_sequence: str | list[str] | None = None, **options: Any):
        if stop_sequence is not None:
            options["stop"] = [stop_sequence] if isinstance(stop_sequence, str) else list(stop_sequence)
        forward = {}
        if options:
            decoding_for(self.model, **options)  # refused here, at the call, before any prompt is encoded
            forward["options"] = options
        post = {}
        if return_full_text is not None:
            post["return_full_text"] = return_full_text
        if return_tensors is not None:
            post["return_tensors"] = return_tensors
            forward["return_tensors"] = return_tensors
        return {}, forward, post

    def preprocess(self, inputs: Any) -> dict[str, Any]:
        messages = getattr(inputs, "messages", None)  # transformers wraps a chat in its `Chat`
        if messages is not None:
            return {"text": render_chat(self.tokenizer, messages), "messages": list(messages)}
        if not isinstance(inputs, str):
            raise ValueError(f"text-generation input must be a prompt string, a chat (a list of {{'role', 'content'}} "
                             f"messages) or a list of them, got {type(inputs).__name__}")
        return {"text": inputs, "messages": None}

    def _forward(self, inputs: dict[str, Any], options: dict[str, Any] | None = None,
                 return_tensors: bool = False) -> dict[str, Any]:
        config = decoding_for(self.model, **(options or {}))
        if return_tensors:
            no_stop = config.override(stop=[])
            room = self.model.config.max_position_embeddings - config.max_new_tokens
            prompt = encode_prompts(self.tokenizer, [inputs["text"]], max_prompt_tokens=max(room, 0))
            ids = torch.tensor(prompt, dtype=torch.long, device=self.model.device)
            return {**inputs, "ids": diffusion_generate(self.model, ids, generation_config=no_stop,
                                                        tokenizer=self.tokenizer)[0]}
        return {**inputs, "answer": generate(self.model, self.tokenizer, [inputs["text"]], config=config)[0]}

    def postprocess(self, outputs: dict[str, Any], return_full_text: bool = True,
                    return_tensors: bool = False) -> list[dict[str, Any]]:
        if return_tensors:
            return [{"generated_token_ids": outputs["ids"].tolist()}]
        answer = outputs["answer"]
        if outputs["messages"] is not None:
            reply = {"role": "assistant", "content": answer}
            return [{"generated_text": [*outputs["messages"], reply] if return_full_text else answer}]
        return [{"generated_text": outputs["text"] + answer if return_full_text else answer}]
