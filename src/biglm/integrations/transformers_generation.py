"""Generation the transformers way: ``model.generate(input_ids, ...)`` on a loaded BiGLM and
``pipeline("text-generation", model=EXPORT)``, both through biglm's own decoding.

A BiGLM does not write left to right, so transformers' `GenerationMixin` (a next-token loop over a KV cache) cannot
drive it. As Dream's remote code does, the model has a ``diffusion_generate`` (and ``generate``, the same) that runs
`biglm.generation.decoding.generate_ids` with the model's decoding settings (`model_decoding`: what `biglm generate`,
`biglm chat` and `biglm serve` decode it with) under the options given: `DecodingConfig`'s fields (``steps``,
``strategy``, ``seed``...) and transformers' generation options with their transformers meaning (`resolve_call`):
``do_sample`` decides whether to sample (``temperature``, ``top_k``, ``top_p`` are ignored without it, with
transformers' warning; ``do_sample=True, temperature=0.0`` is refused as transformers refuses it), a sampled call
without biglm's ``seed`` draws its seed from torch's global random stream (so ``transformers.set_seed`` fixes the text
and successive calls differ, as with an autoregressive model), ``pad_token_id``/``eos_token_id``, a
``generation_config`` (``model.generation_config`` by default) and a ``streamer`` (`TextStreamer`,
`TextIteratorStreamer`: the prompt, then the answer's tokens as they become final, then ``end()``). The ids it returns
are transformers': the prompt, then each answer up to its end-of-text token, padded with the pad id to the longest
answer.

The pipeline writes what `biglm generate` prints: the prompt is encoded as `biglm.generation.api.generate` encodes it
(no special tokens, cut from the left to fit), prompts of any lengths are batched (``batch_size=``) and padded by the
pipeline, the answer is decoded and cut at the stop strings. A chat (a list of ``{"role", "content"}`` messages) is
rendered by the model's chat template as `biglm chat` does (``continue_final_message`` continues its last message).
``import biglm`` makes ``pipeline("text-generation")`` build `TextGenerationPipeline` for BiGLM models and
transformers' own pipeline for every other model.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from transformers import GenerationConfig
from transformers.pipelines.base import Pipeline
from transformers.pipelines.text_generation import ReturnType
from transformers.pipelines.text_generation import TextGenerationPipeline as _TransformersTextGeneration

from ..generation.api import _check_model, cut_at_stop, encode_prompts
from ..generation.chat import chat_template, check_messages, render_chat
from ..generation.config import FIELDS, DecodingConfig, model_decoding
from ..generation.decoding import StepInfo, generate_ids, left_pad
from ..generation.strategies import get_strategy
from ..model import BiGLMForMaskedLM

__all__ = ["TextGenerationPipeline", "diffusion_generate", "decoding_for", "resolve_call", "GenerateCall"]

# transformers' GenerationConfig fields that mean what the DecodingConfig field of the same name means
_SAME = ("max_new_tokens", "temperature", "top_k", "top_p", "use_cache")
# the fields read apart: whether to sample, the stop strings, one answer per prompt, the special ids
_READ = ("do_sample", "stop_strings", "num_return_sequences", "pad_token_id", "eos_token_id", "bos_token_id")
_SAMPLING = ("temperature", "top_k", "top_p")
_GENERATION_KEYS = frozenset(k for k in vars(GenerationConfig()) if not k.startswith("_"))
_HINTS = {"max_length": "an answer's length is max_new_tokens here (the prompt is not counted): give max_new_tokens"}


@dataclass(frozen=True)
class GenerateCall:
    """What one ``generate`` call decodes with: the `DecodingConfig`, the id its answers are padded with, the ids that
    end an answer (none with ``ignore_eos``) and whether its seed is to be drawn from torch's global random stream (a
    sampled call given no ``seed``)."""

    decoding: DecodingConfig
    pad_token_id: int
    ends: frozenset[int]
    draw_seed: bool

    def drawn(self) -> DecodingConfig:
        """The decoding of this call, with its seed drawn now from torch's global random stream where it is to be
        (one draw per call, as an autoregressive model's sampling advances that stream)."""
        if not self.draw_seed:
            return self.decoding
        return self.decoding.override(seed=int(torch.randint(0, 2**62, ()).item()))


def _hints(names: Any) -> str:
    return "".join(f"; {k}: {_HINTS[k]}" for k in sorted(names) if k in _HINTS)


def _ids(value: Any) -> set[int]:
    return set() if value is None else {int(value)} if isinstance(value, int) else {int(v) for v in value}


def resolve_call(model: torch.nn.Module, config: Any = None, **options: Any) -> GenerateCall:
    """A call's settings from ``config`` (a transformers ``GenerationConfig``, default ``model.generation_config``, or
    a biglm `DecodingConfig`) and ``options`` (`DecodingConfig` fields and transformers' generation options), with
    transformers' meaning for its options: not sampled unless ``do_sample`` (temperature, top-k and top-p are then
    ignored, with transformers' warning), sampled at ``temperature`` (default 1.0, > 0) with it; ``stop_strings``,
    ``pad_token_id``, ``eos_token_id`` (more ids that end an answer), ``bos_token_id`` (unused) and
    ``num_return_sequences=1`` are read; any other option, or a generation setting a BiGLM's decoding has no
    counterpart for, is refused naming what is accepted. A field given neither here nor in a ``GenerationConfig``
    takes the model's decoding settings (`model_decoding`, those of `biglm generate`)."""
    options = dict(options)
    biglm_config = isinstance(config, DecodingConfig)
    if biglm_config:  # biglm's own object, read with biglm's meaning; transformers' keywords on top
        given = {k: options.pop(k) for k in _READ if k in options}
    else:
        if config is not None and not isinstance(config, GenerationConfig):
            raise ValueError(f"generation_config must be a transformers GenerationConfig or a biglm DecodingConfig, "
                             f"got {type(config).__name__}")
        base = config if config is not None else getattr(model, "generation_config", None)
        gen = copy.deepcopy(base) if base is not None else GenerationConfig()
        # transformers' own checks and warnings (a sampling option without do_sample...)
        gen.update(**{k: options.pop(k) for k in list(options) if k in _GENERATION_KEYS})
        # what the config sets: neither transformers' unset value nor the model's own (its special ids)
        unset = GenerationConfig().to_dict(), GenerationConfig.from_model_config(model.config).to_dict()
        given = {k: v for k, v in gen.to_dict().items()
                 if not k.startswith("_") and k != "transformers_version" and all(v != u.get(k) for u in unset)}
        for k in _SAME:
            if k in given:
                options[k] = given.pop(k)
    if options.get("use_cache") is True:  # transformers' default, and biglm's: not a choice of how to decode
        del options["use_cache"]
    if options.pop("num_return_sequences", given.pop("num_return_sequences", None)) not in (None, 1):
        raise ValueError("num_return_sequences: a BiGLM writes one answer per prompt here (num_return_sequences=1)")
    if "stop_strings" in given:
        stop = given.pop("stop_strings")
        options["stop"] = [stop] if isinstance(stop, str) else list(stop or [])
    do_sample = given.pop("do_sample", None)
    pad, eos = given.pop("pad_token_id", None), given.pop("eos_token_id", None)
    given.pop("bos_token_id", None)
    if given:
        raise ValueError(f"generation option(s) {', '.join(f'{k}={v!r}' for k, v in sorted(given.items()))}: no "
                         f"counterpart in a BiGLM's decoding{_hints(given)} (it reads {', '.join(_SAME)}, do_sample, "
                         "stop_strings, pad_token_id, eos_token_id and num_return_sequences=1, and biglm's "
                         "DecodingConfig fields as keywords)")
    unknown = sorted(set(options) - set(FIELDS))
    if unknown:
        raise ValueError(f"unknown generation option(s) {', '.join(unknown)}{_hints(unknown)}: a BiGLM decodes with "
                         f"biglm's options ({', '.join(FIELDS)}) and transformers' do_sample, pad_token_id, "
                         "eos_token_id, stop_strings, streamer and generation_config")
    if do_sample:
        temperature = options.get("temperature")
        if temperature is None and not (biglm_config and config.temperature > 0):
            temperature = 1.0  # transformers' default
        if temperature is not None and not temperature > 0:
            raise ValueError(f"`temperature` (={temperature}) has to be a strictly positive float, otherwise your next "
                             "token scores will be invalid. If you're looking for greedy decoding strategies, set "
                             "`do_sample=False`.")
        if temperature is not None:
            options["temperature"] = float(temperature)
    elif not biglm_config or do_sample is False:  # greedy: transformers ignores the sampling options (it warned)
        for k in _SAMPLING:
            options.pop(k, None)
        if biglm_config:
            options.update(temperature=0.0, top_k=None, top_p=None)
    decoding = config.override(**options) if biglm_config else model_decoding(model.config, options)
    mc = model.config
    ends = set() if decoding.ignore_eos else (_ids(mc.eos_token_id) | _ids(eos))
    fill = pad if pad is not None else mc.pad_token_id if mc.pad_token_id is not None else 0
    return GenerateCall(decoding=decoding, pad_token_id=int(fill), ends=frozenset(ends),
                        draw_seed=decoding.temperature > 0 and "seed" not in options and not biglm_config)


def decoding_for(model: torch.nn.Module, config: Any = None, **options: Any) -> DecodingConfig:
    """The `DecodingConfig` a ``generate`` call with ``config`` and ``options`` decodes with (`resolve_call`), its
    seed drawn from torch's global random stream where the call samples without one."""
    return resolve_call(model, config, **options).drawn()


class _Streamer:
    """Feeds a transformers streamer (``put``/``end``: `TextStreamer`, `TextIteratorStreamer`) from a decode's steps:
    each answer token once it can no longer change, left to right, up to the first token that ends the answer. A
    token is final once written by a strategy that never re-masks (and in speculative decoding), or once its block is
    done with a re-masking one; with several candidate lengths (a length beam) the answer is only known at the end."""

    def __init__(self, streamer: Any, *, mask_id: int, ends: frozenset[int]) -> None:
        self.streamer, self.mask_id, self.ends = streamer, mask_id, ends
        self.sent: list[int] = []
        self.block, self.block_start, self.ended = -1, 0, False

    def __call__(self, info: StepInfo) -> None:
        if self.ended or info.output_ids.shape[0] != 1:
            return
        row = info.output_ids[0, :int(info.candidate_length[0])]
        lead = int((row != self.mask_id).long().cumprod(0).sum())  # the leading run of written slots
        if info.drafts is None and get_strategy(info.strategy).remasks:
            if info.block != self.block:  # a block's first call predicts all its slots: earlier blocks are done
                self.block, first = info.block, info.predicted[0].nonzero()
                self.block_start = int(first[0]) if first.numel() else lead
            lead = min(lead, self.block_start)
        self._send(row[:lead].tolist())

    def _send(self, tokens: list[int]) -> None:
        new = tokens[len(self.sent):]
        for i, t in enumerate(new):
            if t in self.ends:
                new, self.ended = new[:i + 1], True
                break
        if new:
            self.streamer.put(torch.tensor(new, dtype=torch.long))
            self.sent += new

    def finish(self, answer: list[int]) -> None:
        """The rest of the ``answer`` written (its tokens and the end token), then ``end()``."""
        self.ended = False
        self._send(answer)
        self.streamer.end()


def _generate(model: torch.nn.Module, ids: torch.Tensor, attention_mask: torch.Tensor | None, *, config: Any,
              tokenizer: Any, streamer: Any, options: dict[str, Any],
              ) -> tuple[torch.LongTensor, list[list[int]], list[bool]]:
    """``(sequences (B, P + n), answers, ended)``: each prompt as given followed by its answer (cut after the token
    that ends it, then the pad id), the answers' ids (the end token included where one ended it) and whether one
    did."""
    if not isinstance(ids, torch.Tensor) or ids.ndim != 2 or ids.shape[0] == 0:
        raise ValueError("input_ids must be a (batch, length) tensor of token ids "
                         "(tokenizer(..., return_tensors='pt'))")
    call = resolve_call(model, config, **options)
    if call.decoding.stop:
        raise ValueError("stop strings cut the answer's text: pass them to pipeline('text-generation') "
                         "(stop_sequence=) or biglm.generation.generate (stop=); model.generate returns ids")
    if streamer is not None and ids.shape[0] != 1:
        raise ValueError(f"streamer: one prompt at a time (got a batch of {ids.shape[0]}), as transformers' streamers")
    cfg = call.drawn()
    mask = torch.ones_like(ids) if attention_mask is None else attention_mask
    prompts = [row[m.bool()].tolist() for row, m in zip(ids.cpu(), mask.cpu())]
    mc = model.config
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = left_pad(prompts, pad_id=mc.pad_token_id if mc.pad_token_id is not None else 0,
                                       device=device)
    extra = list(range(len(tokenizer), mc.vocab_size)) if tokenizer is not None else []
    feed = None
    if streamer is not None:
        streamer.put(ids.cpu())
        feed = _Streamer(streamer, mask_id=mc.mask_token_id, ends=call.ends)
    out = generate_ids(model, prompt_ids, prompt_mask, config=cfg, suppress_ids=extra, on_step=feed)
    answers = []
    for row, n in zip(out.tokens.tolist(), out.lengths.tolist()):
        ended = n < len(row) and row[n] == mc.eos_token_id  # the model's end token ended it: kept, as transformers
        answer = row[:n + ended]
        end = next((i for i, t in enumerate(answer) if t in call.ends), None)
        answers.append(answer if end is None else answer[:end + 1])
    if feed is not None:
        feed.finish(answers[0])
    width = max(len(a) for a in answers)
    tail = torch.full((len(answers), width), call.pad_token_id, dtype=ids.dtype, device=ids.device)
    for i, a in enumerate(answers):
        tail[i, :len(a)] = torch.tensor(a, dtype=ids.dtype)
    return torch.cat([ids, tail], dim=1), answers, [bool(a) and a[-1] in call.ends for a in answers]


def diffusion_generate(model: torch.nn.Module, inputs: torch.Tensor | None = None, *,
                       input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                       generation_config: Any = None, tokenizer: Any = None, streamer: Any = None,
                       **options: Any) -> torch.LongTensor:
    """``model.generate`` / ``model.diffusion_generate``: answers for the prompts ``input_ids`` (B, P) (padded on
    either side where ``attention_mask`` is 0) by biglm's iterative unmasking, with the options of `resolve_call`;
    returns (B, P + n) ids, each prompt as given followed by its answer (cut after its end token, then the pad id).
    ``tokenizer``, when given, keeps ids past its vocabulary out of the answers, as `biglm generate` does (a model
    vocabulary padded for speed). ``streamer`` (one prompt): ``put`` the prompt, then the answer's tokens as they
    become final, then ``end()``."""
    if inputs is not None and input_ids is not None:
        raise ValueError("give the prompts once: inputs or input_ids")
    return _generate(model, inputs if inputs is not None else input_ids, attention_mask, config=generation_config,
                     tokenizer=tokenizer, streamer=streamer, options=options)[0]


_ENCODING = ("truncation", "max_length", "padding", "add_special_tokens", "tokenizer_encode_kwargs", "tools",
             "documents")


class TextGenerationPipeline(Pipeline):
    """``pipeline("text-generation", model=EXPORT)``: ``gen("Once upon a time")`` ->
    ``[{"generated_text": PROMPT + ANSWER}]`` (``return_full_text=False``: the answer alone, as `biglm generate`
    prints it; ``return_tensors=True``: ``generated_token_ids``, `diffusion_generate`'s row). A list of prompts gives
    a list of such lists (``batch_size=`` decodes them together, any lengths); a chat gives the messages with the
    assistant's answer appended (with ``continue_final_message``: its last message continued).

    Options: `DecodingConfig`'s fields (``max_new_tokens``, ``steps``, ``strategy``, ``seed``, ``stop``...;
    defaults: the model's decoding settings, those of `biglm generate`) and transformers' generation options as
    `resolve_call` reads them (``do_sample``, ``temperature``, ``generation_config``, ``generate_kwargs``,
    ``streamer``...); transformers' pipeline options ``return_full_text``, ``return_text``, ``return_tensors``,
    ``return_type``, ``clean_up_tokenization_spaces``, ``skip_special_tokens``, ``prefix``,
    ``continue_final_message``, ``stop_sequence`` (the stop string is dropped, as `biglm generate` drops it) and
    ``handle_long_generation`` (a prompt is always cut from the left to fit beside the answer). Built for BiGLM
    models; for any other model, transformers' own text-generation pipeline is built instead."""

    _pipeline_calls_generate = True  # the base keeps generation options given at construction for every call
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    def __new__(cls, *args: Any, **kwargs: Any):
        model = kwargs.get("model", args[0] if args else None)
        if cls is TextGenerationPipeline and not isinstance(model, BiGLMForMaskedLM):
            return _TransformersTextGeneration(*args, **kwargs)
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        stop = self._generate_kwargs.pop("stop_strings", None)  # set aside by the base with the generation options
        if stop is not None:
            self._postprocess_params["stop"] = [stop] if isinstance(stop, str) else list(stop)
        if self.tokenizer is not None and self.tokenizer.padding_side == "right":
            self.tokenizer.padding_side = "left"  # a batch's prompts end where the answers start, as transformers'

    def _sanitize_parameters(self, return_full_text: bool | None = None, return_tensors: bool | None = None,
                             return_text: bool | None = None, return_type: ReturnType | None = None,
                             clean_up_tokenization_spaces: bool | None = None, prefix: str | None = None,
                             handle_long_generation: str | None = None,
                             stop_sequence: str | list[str] | None = None,
                             continue_final_message: bool | None = None, skip_special_tokens: bool | None = None,
                             generate_kwargs: dict[str, Any] | None = None, **options: Any):
        refused = sorted(set(options) & set(_ENCODING))
        if refused:
            raise ValueError(f"text-generation option(s) {', '.join(refused)}: a BiGLM's prompt is encoded as "
                             "`biglm generate` encodes it (no special tokens, cut from the left to fit beside the "
                             "answer); give the answer's length as max_new_tokens")
        twice = sorted(set(options) & set(generate_kwargs or {}))
        if twice:
            raise ValueError(f"{', '.join(twice)} given both as a keyword and in generate_kwargs: give it once")
        options = {**(generate_kwargs or {}), **options}
        if handle_long_generation not in (None, "hole"):
            raise ValueError(f"{handle_long_generation} is not a valid value for `handle_long_generation` parameter "
                             "expected [None, 'hole']")
        stop = options.pop("stop", None)
        if stop_sequence is not None or options.get("stop_strings") is not None:
            given = stop_sequence if stop_sequence is not None else options.pop("stop_strings")
            stop = [given] if isinstance(given, str) else list(given)
        options.pop("stop_strings", None)
        self._resolve(options)  # refused here, at the call, before any prompt is encoded
        pre: dict[str, Any] = {"options": options}
        if prefix is not None:
            pre["prefix"] = prefix
        if continue_final_message is not None:
            pre["continue_final_message"] = continue_final_message
        post: dict[str, Any] = {}
        if return_full_text is not None and return_type is None:
            if return_text is not None:
                raise ValueError("`return_text` is mutually exclusive with `return_full_text`")
            if return_tensors is not None:
                raise ValueError("`return_full_text` is mutually exclusive with `return_tensors`")
            return_type = ReturnType.FULL_TEXT if return_full_text else ReturnType.NEW_TEXT
        if return_tensors is not None and return_type is None:
            if return_text is not None:
                raise ValueError("`return_text` is mutually exclusive with `return_tensors`")
            return_type = ReturnType.TENSORS
        if return_type is not None:
            post["return_type"] = return_type
        for name, value in (("clean_up_tokenization_spaces", clean_up_tokenization_spaces), ("stop", stop),
                            ("continue_final_message", continue_final_message),
                            ("skip_special_tokens", skip_special_tokens)):
            if value is not None:
                post[name] = value
        return pre, options, post

    def _resolve(self, options: dict[str, Any]) -> GenerateCall:
        """The settings a call with ``options`` decodes with: those given at construction under them (transformers'
        `_prepare_generate_kwargs`), read by `resolve_call`."""
        kwargs = self._prepare_generate_kwargs({k: v for k, v in options.items() if k != "streamer"})
        return resolve_call(self.model, kwargs.pop("generation_config", None), **kwargs)

    def preprocess(self, inputs: Any, options: dict[str, Any] | None = None, prefix: str = "",
                   continue_final_message: bool | None = None) -> dict[str, Any]:
        messages = getattr(inputs, "messages", None)  # transformers wraps a chat in its `Chat`
        if messages is not None:
            if continue_final_message is None:
                continue_final_message = messages[-1]["role"] == "assistant"
            if continue_final_message:
                text = self.tokenizer.apply_chat_template(check_messages(messages), tokenize=False,
                                                          chat_template=chat_template(self.tokenizer),
                                                          add_generation_prompt=False, continue_final_message=True)
            else:
                text = render_chat(self.tokenizer, messages)
        elif isinstance(inputs, str):
            text = prefix + inputs
        else:
            raise ValueError(f"text-generation input must be a prompt string, a chat (a list of {{'role', 'content'}} "
                             f"messages) or a list of them, got {type(inputs).__name__}")
        # the prompt tokens that fit beside the answer, under the options given at construction and at this call
        room = _check_model(self.model, self._resolve({**self._forward_params, **(options or {})}).decoding)
        prompt = encode_prompts(self.tokenizer, [text], max_prompt_tokens=room)[0]
        ids = torch.tensor([prompt], dtype=torch.long)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "prompt_text": inputs}

    def _forward(self, model_inputs: dict[str, Any], **options: Any) -> dict[str, Any]:
        kwargs = self._prepare_generate_kwargs(options)
        config, streamer = kwargs.pop("generation_config", None), kwargs.pop("streamer", None)
        ids = model_inputs["input_ids"]
        sequences, answers, ended = _generate(self.model, ids, model_inputs["attention_mask"], config=config,
                                              tokenizer=self.tokenizer, streamer=streamer, options=kwargs)
        # the answer's own length (its end token counted where one ended it), not the batch's padded width
        lengths = torch.tensor([len(a) - e for a, e in zip(answers, ended)])
        return {"generated_sequence": sequences, "answer_length": lengths, "ended": torch.tensor(ended),
                "input_ids": ids, "prompt_text": model_inputs["prompt_text"]}

    def postprocess(self, outputs: dict[str, Any], return_type: ReturnType = ReturnType.FULL_TEXT,
                    clean_up_tokenization_spaces: bool | None = None, stop: list[str] | None = None,
                    continue_final_message: bool | None = None,
                    skip_special_tokens: bool | None = None) -> list[dict[str, Any]]:
        sequence = outputs["generated_sequence"][0]
        if return_type == ReturnType.TENSORS:
            return [{"generated_token_ids": sequence.tolist()}]
        skip = True if skip_special_tokens is None else skip_special_tokens
        start = outputs["input_ids"].shape[-1]
        # the answer without its end token, as `biglm generate` decodes it (with it where special tokens are kept)
        n = int(outputs["answer_length"].reshape(-1)[0]) + (not skip and bool(outputs["ended"].reshape(-1)[0]))
        decode = {} if clean_up_tokenization_spaces is None else {
            "clean_up_tokenization_spaces": clean_up_tokenization_spaces}
        answer = self.tokenizer.decode(sequence[start:start + n].tolist(), skip_special_tokens=skip, **decode)
        if stop:
            answer = cut_at_stop(answer, stop)
        prompt = outputs["prompt_text"]
        messages = getattr(prompt, "messages", None)
        if return_type == ReturnType.NEW_TEXT:
            return [{"generated_text": answer}]
        if messages is None:
            return [{"generated_text": prompt + answer}]
        if continue_final_message is None:
            continue_final_message = messages[-1]["role"] == "assistant"
        if continue_final_message:
            last = messages[-1]
            return [{"generated_text": [*messages[:-1], {"role": last["role"], "content": last["content"] + answer}]}]
        return [{"generated_text": [*messages, {"role": "assistant", "content": answer}]}]


