"""The OpenAI wire format spoken by `biglm serve`: request and response schemas (pydantic) and the
one mapping from a request's decoding fields to a `DecodingConfig`.

Why a module of its own: the HTTP layer (`app`) and the engine loop (`scheduler`) should not know
field names. A request is parsed here (unknown fields refused, never ignored), its decoding fields
become one `DecodingConfig` that is validated once, where it is built, and every error is an
`APIError` carrying the OpenAI error body (``{"error": {"message", "type", "param", "code"}}``) and
its HTTP status. Text that is not Unicode (a lone UTF-16 surrogate, which JSON's ``\ud800`` escape can
spell) is refused here, anywhere in the body, before any of it reaches a tokenizer or an error message.

Decoding fields keep OpenAI's names where OpenAI has one (``max_tokens`` -> ``max_new_tokens``, chat's
``max_completion_tokens`` too, ``temperature``, ``top_p``, ``stop``, ``seed``); OpenAI fields biglm honours only at
their no-op value (``frequency_penalty``/``presence_penalty`` 0, ``response_format`` text, ``store`` false) are
accepted at that value and refused otherwise, naming the field; booleans are strict (``"stream": "yes"`` is a 400,
``null`` the default); biglm's own options (``steps``, ``strategy``,
``block_length``, ``top_k``, ``threshold``, ``early_stop``, ...) are extra top-level fields, sent by
the `openai` client through ``extra_body``. Their values are checked by `DecodingConfig` itself, so
the server and `biglm generate` accept and refuse exactly the same settings.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
import uuid
from collections.abc import Collection
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, create_model, model_validator
from pydantic_core import PydanticCustomError

from ..generation.config import FIELDS, SHAPE_FIELDS, DecodingConfig

# request field -> DecodingConfig field; OpenAI's names first, then biglm's own
OPENAI_FIELDS: dict[str, str] = {"max_tokens": "max_new_tokens", "temperature": "temperature", "top_p": "top_p",
                                 "stop": "stop", "seed": "seed"}
# biglm's decoding options a request may set (use_cache is an implementation check, not a request option;
# max_new_tokens is spelled max_tokens on this API)
EXTRA_FIELDS: tuple[str, ...] = tuple(f for f in FIELDS if f not in {"use_cache", "max_new_tokens", *OPENAI_FIELDS})
PENALTIES = ("frequency_penalty", "presence_penalty")  # OpenAI's; biglm implements neither: 0 (their default) only
MAX_N = 16  # choices per prompt
_SURROGATE = re.compile("[\ud800-\udfff]")


class APIError(Exception):
    """An error answered as OpenAI does: HTTP ``status`` and ``{"error": {...}}``."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def lone_surrogate(value: Any, path: str = "") -> tuple[str, int] | None:
    """(where, character index) of the first lone surrogate in a parsed JSON value (keys included), or None.

    Why: JSON may escape any UTF-16 unit (``"\\ud800"``), so a body that parses can hold a "string" that is no
    Unicode text: tokenizers, and an error message that quotes it, fail on it. A proper pair (``"\\ud83d\\ude00"``)
    is one character once parsed, and passes."""
    if isinstance(value, str):
        found = _SURROGATE.search(value)
        return None if found is None else (path or "body", found.start())
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        where = f"{path}.{key}" if path else str(key)
        if isinstance(key, str) and _SURROGATE.search(key):
            return path or "body", -1
        hit = lone_surrogate(item, where)
        if hit is not None:
            return hit
    return None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: StrictBool = False
    """send a last chunk with the usage (empty choices), as OpenAI does"""


class _RequestBase(BaseModel):
    """Fields shared by both endpoints. Decoding fields are typed ``Any`` on purpose: `DecodingConfig`
    checks them (one validation, one set of messages for the server and the CLI)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    max_tokens: Any = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    temperature: Any = None
    top_p: Any = None
    stop: Any = None
    seed: Any = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    stream: StrictBool | None = None
    """true: server-sent events; false or null (OpenAI's default): one answer. Strict: "yes" or 1 is a 400, not a
    stream"""
    stream_options: StreamOptions | None = None
    response_format: Any = None
    """``{"type": "text"}`` only (OpenAI's default, as vLLM takes it on both endpoints): a JSON answer is refused
    (`check_response_fields`)"""
    user: str | None = None  # an end-user id for the caller's own logs; it changes nothing

    @model_validator(mode="before")
    @classmethod
    def _unicode_only(cls, data: Any) -> Any:
        hit = lone_surrogate(data)
        if hit is not None:
            where, index = hit
            at = "a field name" if index < 0 else f"character {index}"
            raise PydanticCustomError(
                "invalid_unicode", "{param} holds a lone UTF-16 surrogate ({at}), which is not a Unicode character: "
                "send UTF-8 text (a \\uD800-\\uDFFF escape must be half of a surrogate pair).",
                {"param": where, "at": at})
        return data


# biglm's own decoding options, one request field per DecodingConfig field (so a new field is reachable at once)
_Request = create_model("_Request", __base__=_RequestBase, **{name: (Any, None) for name in EXTRA_FIELDS})


class CompletionRequest(_Request):
    """``POST /v1/completions``. A prompt is text or token ids; several prompts are a list of either."""

    prompt: str | list[str] | list[int] | list[list[int]]
    echo: StrictBool = False
    """the answer's text starts with the prompt's"""
    logprobs: int | None = None
    """0: each written token's log-probability (OpenAI's ``logprobs``; more alternatives are not kept)"""


class ChatCompletionRequest(_Request):
    """``POST /v1/chat/completions``."""

    messages: Any  # checked by `generation.chat.check_messages`, the chat format's own rules
    max_completion_tokens: Any = None  # OpenAI's newer name of max_tokens
    store: StrictBool | None = None
    """false or null only: biglm keeps no completions for OpenAI's evals or distillation"""
    logprobs: StrictBool = False
    """each written token's log-probability"""
    top_logprobs: int | None = None
    """0 only: the alternatives are not kept"""


def decoding_config(request: _RequestBase, *, base: DecodingConfig, max_steps: int,
                    model_default: Collection[str] = ()) -> DecodingConfig:
    """The request's decoding options on top of the server's defaults ``base``, validated once.

    A field left out (or null) keeps ``base``'s value; a bad value is a 400 naming the request's own
    field (``max_tokens``, not ``max_new_tokens``). ``model_default``: the fields of ``base`` that are the model's own
    default decoding (`config.model_default_fields`); a request that names how to decode (`config.SHAPE_FIELDS`, e.g.
    ``draft_length: 0``) gets those back at `DecodingConfig`'s defaults, so it decodes exactly as it says, as
    `biglm generate` with the same flags.
    """
    for name in PENALTIES:
        if getattr(request, name) not in (None, 0):
            raise APIError(400, f"{name}={getattr(request, name)}: biglm does not implement {name.split('_')[0]} "
                                "penalties; send 0 (no penalty) or leave it out.", param=name, code="unsupported_value")
    changes: dict[str, Any] = {}
    names = {**OPENAI_FIELDS, **{f: f for f in EXTRA_FIELDS}}
    limit = getattr(request, "max_completion_tokens", None)
    if limit is not None:  # chat's newer name of max_tokens: the same field, so errors name the one sent
        if request.max_tokens is not None and request.max_tokens != limit:
            raise APIError(400, f"max_tokens={request.max_tokens} and max_completion_tokens={limit} disagree: send "
                                "one of them.", param="max_completion_tokens", code="invalid_value")
        names = {("max_completion_tokens" if f == "max_tokens" else f): t for f, t in names.items()}
    for field, target in names.items():
        value = getattr(request, field)
        if value is not None:
            changes[target] = value
    if model_default and set(changes) & set(SHAPE_FIELDS):
        plain = DecodingConfig()
        base = dataclasses.replace(base, **{name: getattr(plain, name) for name in model_default})
    try:
        config = dataclasses.replace(base, **changes)
    except (ValueError, TypeError) as e:
        message = str(e)
        # the option DecodingConfig names (e.g. steps, refused beside draft_length), else the one the message opens with
        option = getattr(e, "option", None)
        param = next((f for f, t in names.items() if t == option), None) or next(
            (f for f, t in names.items() if message.startswith((f"{t}=", f"{t} "))), None)
        if param is not None and names[param] != param:
            message = message.replace(names[param], param)
        raise APIError(400, message, param=param, code="invalid_value") from None
    steps = config.steps
    if steps is not None and steps > max_steps:
        raise APIError(400, f"steps={steps} is more model calls than this server allows ({max_steps}, the model's "
                            "window unless `biglm serve --max_steps` says otherwise): ask for fewer.",
                       param="steps", code="invalid_value")
    return config


def wants_logprobs(request: CompletionRequest | ChatCompletionRequest) -> bool:
    """Whether ``request`` asks for its tokens' log-probabilities; a 400 for what biglm cannot give: alternatives (the
    decoders keep the written token's probability only) and an echoed prompt's (it is read, not written)."""
    chat = isinstance(request, ChatCompletionRequest)
    wanted, alternatives = (request.logprobs, request.top_logprobs) if chat else (request.logprobs, request.logprobs)
    param = "top_logprobs" if chat else "logprobs"
    if alternatives is not None and alternatives < 0:
        raise APIError(400, f"{param}={alternatives} must be >= 0.", param=param, code="invalid_value")
    if alternatives:
        raise APIError(400, f"{param}={alternatives}: biglm keeps the log-probability of each written token only, not "
                            f"its alternatives: send {param}=0" + (" (with logprobs=true)" if chat else "") +
                            " or leave it out.", param=param, code="unsupported_value")
    if chat and alternatives is not None and not wanted:
        raise APIError(400, "top_logprobs goes with logprobs=true.", param="top_logprobs", code="invalid_value")
    if not chat and wanted is not None and request.echo:
        raise APIError(400, "echo with logprobs asks for the prompt's log-probabilities, which biglm does not compute "
                            "(it writes the answer, it does not score the prompt): drop one of them.", param="logprobs",
                       code="unsupported_value")
    return bool(wanted is not None if not chat else wanted)


def check_response_fields(request: CompletionRequest | ChatCompletionRequest) -> None:
    """A 400 for OpenAI's answer options biglm cannot honour: a ``response_format`` other than text (the decoders do
    not constrain an answer to JSON) and ``store: true`` (nothing is kept); their defaults are accepted."""
    fmt = request.response_format
    if fmt is not None:
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind in (None, "text") and fmt != {"type": "text"}:  # not OpenAI's shape at all
            raise APIError(400, f"response_format={json.dumps(fmt)[:200]}: send {{\"type\": \"text\"}} or leave it "
                                "out.", param="response_format", code="invalid_value")
        if kind != "text":  # json_object, json_schema: a constrained answer
            raise APIError(400, f"response_format type {kind!r}: biglm writes text only (its decoders do not "
                                "constrain an answer to JSON); send {\"type\": \"text\"} or leave it out.",
                           param="response_format", code="unsupported_value")
    if getattr(request, "store", None):
        raise APIError(400, "store=true: biglm serve keeps no completions (there are no stored completions to list "
                            "or distill); send false or leave it out.", param="store", code="unsupported_value")


def check_stream(request: CompletionRequest | ChatCompletionRequest) -> None:
    """``stream_options`` goes with ``stream: true``, as OpenAI answers (a 400, not ignored)."""
    if request.stream_options is not None and not request.stream:
        raise APIError(400, "stream_options is only allowed with stream=true: send stream=true or leave "
                            "stream_options out.", param="stream_options", code="invalid_value")


def openai_messages(messages: Any) -> Any:
    """Chat ``messages`` as the chat format reads them: OpenAI's ``developer`` role (what current SDKs send for the
    instructions of reasoning models) is the ``system`` role, as vLLM reads it. Anything else is left for
    `generation.chat.check_messages` to judge."""
    if not isinstance(messages, list):
        return messages
    return [{**m, "role": "system"} if isinstance(m, dict) and m.get("role") == "developer" else m for m in messages]


# ----- responses -----------------------------------------------------------------------------------

FinishReason = Literal["stop", "length"]


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class _Choice(BaseModel):
    """What every choice of every response carries (a subclass adds its text, message or delta)."""

    index: int
    finish_reason: FinishReason | None


class CompletionLogprobs(BaseModel):
    """A completion's ``logprobs``: per written token its text, log-probability and offset in the choice's text;
    ``top_logprobs`` holds the written token alone (OpenAI's answer to ``logprobs: 0``)."""

    tokens: list[str] = []
    token_logprobs: list[float] = []
    top_logprobs: list[dict[str, float]] = []
    text_offset: list[int] = []


class TokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[dict[str, Any]] = []


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] = []
    refusal: None = None


class _Response(BaseModel):
    """The head of every response and chunk (a subclass narrows ``object`` and adds choices and usage)."""

    id: str
    object: str
    created: int
    model: str


class CompletionChoice(_Choice):
    text: str
    logprobs: CompletionLogprobs | None = None


class CompletionResponse(_Response):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(_Choice):
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None


class ChatCompletionResponse(_Response):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(_Choice):
    delta: ChatDelta
    finish_reason: FinishReason | None = None
    logprobs: ChatLogprobs | None = None


class ChatCompletionChunk(_Response):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "biglm"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
