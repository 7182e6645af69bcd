"""The FastAPI application of `biglm serve`: OpenAI's completions, chat completions, models and a health check; the
step stream (an answer's canvas after every model call) and the playground page that draws it (`playground`).

The HTTP side only parses, checks and streams; decoding happens in one engine thread (`scheduler.Scheduler`, over a
`generation.engine.DecodeEngine`) that batches every request in flight between decoding steps. Each HTTP request
becomes one engine request per (prompt, choice) and receives the engine's events on an asyncio queue; prompts are
rendered and tokenized in a worker thread, so a huge one never holds up the event loop. A request is checked before
any work (a 4xx in OpenAI's error JSON naming the request's own field; anything else a 500 in the same format, an
engine error in one request its 500 alone); OpenAI's fields biglm can honour are honoured, the rest refused. Answers
are cut as `biglm.generation.api.generate` cuts them, so the server answers what `biglm generate` prints for the
same settings and seed; a stream sends the stable part of an answer as it grows, holding back text that may still
change, so the chunks concatenate to the non-streamed answer. Limits: a bounded queue (429), a per-request timeout
(408), a client that goes away cancels its requests, shutdown drains (503). ``GET /health`` and ``GET /metrics``
report the engine's counts. Every field, limit and error: docs/serving.md.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..generation.api import cut_at_stop
from ..generation.canvas import CanvasRecorder, Frame, token_text
from ..generation.chat import render_chat
from ..generation.config import SEEDS, DecodingConfig
from .protocol import (
    APIError,
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChatLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
    StreamOptions,
    TokenLogprob,
    Usage,
    check_response_fields,
    check_stream,
    decoding_config,
    new_id,
    now,
    openai_messages,
    wants_logprobs,
)
from .playground import FILES, FrameDeltas, asset, decoding_fields
from .scheduler import Aborted, Job, Scheduler

log = logging.getLogger(__name__)

PROMPT_CHARS_PER_TOKEN = 32
"""The default character bound of a prompt is this many characters per position of the model's window: far more
than any prompt that fits the window holds (a token is a few characters of text), small enough to tokenize in
milliseconds."""
SERVING = ("ok", "degraded")  # /health states that answer 200: requests are being served


@dataclass(frozen=True)
class ServeSettings:
    """What the app needs besides the model (built by `biglm serve` from its flags)."""

    model_name: str
    max_batch_rows: int = 64
    max_queue: int = 256
    request_timeout: float = 600.0
    max_steps: int | None = None  # None: the model's window
    max_prompt_chars: int | None = None  # None: PROMPT_CHARS_PER_TOKEN per position of the model's window
    defaults: DecodingConfig = field(default_factory=DecodingConfig)
    model_default: tuple[str, ...] = ()  # the fields of ``defaults`` that are the model's own default decoding
    prefill_chunk: int | None = None  # None: the engine's default (`engine.DEFAULT_PREFILL_CHUNK`)
    draft_rows: int | None = None  # None: the engine's default (`engine.DEFAULT_DRAFT_ROWS`)
    prompt_cache_mb: float | None = None  # None: the engine's default (`engine.DEFAULT_PROMPT_CACHE_MB`)


class TextStream:
    """One answer's text as its tokens arrive: the deltas to stream, the final text, the finish reason."""

    def __init__(self, tokenizer: Any, *, eos_id: int | None, stop: Sequence[str]) -> None:
        self.tokenizer, self.eos_id, self.stop = tokenizer, eos_id, [s for s in stop if s]
        self.sent = ""  # text already streamed, always a prefix of the final text
        self.text = ""
        self.completion_tokens = 0
        self.finish_reason: str | None = None
        self.ids: list[int] = []  # the answer's tokens so far (before an EOS) and their log-probabilities
        self.logprobs: list[float] = []
        self.given = 0  # tokens whose log-probabilities `take_logprobs` handed out
        self._offsets: list[int] = [0]  # where token k's text starts in the answer, for the tokens decoded so far

    def _decode(self, ids: Sequence[int], logprobs: Sequence[float] | None = None) -> tuple[str, bool]:
        ids = list(ids)
        has_eos = self.eos_id is not None and self.eos_id in ids
        if has_eos:
            ids = ids[:ids.index(self.eos_id)]
        self.completion_tokens = len(ids)
        if ids[:len(self.ids)] != self.ids:  # not a growth of what was decoded (a tokenizer hook, a test): start over
            self._offsets = [0]
        self.ids, self.logprobs = ids, list(logprobs or ())[:len(ids)]
        return self.tokenizer.decode(ids, skip_special_tokens=True), has_eos

    def _offset(self, k: int) -> int:
        while len(self._offsets) <= k:
            self._offsets.append(len(self.tokenizer.decode(self.ids[:len(self._offsets)], skip_special_tokens=True)))
        return self._offsets[k]

    def take_logprobs(self) -> list[tuple[str, float, int]]:
        """(text, log-probability, offset in the answer) of each token whose text was sent since the last call (once
        finished: every token the answer holds; tokens cut off by a stop string are not part of it)."""
        out, text = [], self.sent
        while self.given < len(self.logprobs):
            k = self.given
            start, end = self._offset(k), self._offset(k + 1)
            if start >= len(text) if self.finish_reason is not None else end > len(text):
                break
            out.append((text[start:min(end, len(text))], self.logprobs[k], start))
            self.given += 1
        return out

    def update(self, stable_ids: Sequence[int], logprobs: Sequence[float] | None = None) -> str:
        """The new text of a growing stable prefix (finishes the answer if it holds an EOS or a stop string)."""
        if self.finish_reason is not None:
            return ""
        text, has_eos = self._decode(stable_ids, logprobs)
        cut = cut_at_stop(text, self.stop) if self.stop else text
        if len(cut) < len(text):
            self._through_stop(cut)
        if has_eos or len(cut) < len(text):
            return self._finish(cut, "stop")
        text = text.rstrip("\ufffd").rstrip()  # may still change when the next tokens arrive
        hold = max((k for s in self.stop for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        text = text[:len(text) - hold]
        if len(text) > len(self.sent) and text.startswith(self.sent):
            delta, self.sent = text[len(self.sent):], text
            return delta
        return ""

    def finish(self, token_ids: Sequence[int], reason: str | None, logprobs: Sequence[float] | None = None) -> str:
        """The rest of the text once the engine finished the answer."""
        if self.finish_reason is not None:
            return ""
        text, has_eos = self._decode(token_ids, logprobs)
        cut = cut_at_stop(text, self.stop) if self.stop else text
        if len(cut) < len(text):
            self._through_stop(cut)
        return self._finish(cut, "stop" if has_eos or len(cut) < len(text) or reason == "stop" else "length")

    def _through_stop(self, cut: str) -> None:
        """Keep the answer's tokens only up to the one that completes the stop string ending it (``cut``: the text
        before the stop): the tokens one token per call writes before it stops, whatever the decoding wrote past it
        (a speculative call keeps up to ``draft_length`` tokens at once, Mask-Predict fills every slot), so ``usage``
        and the log-probabilities count what the answer holds."""
        def holds(k: int) -> bool:  # the first k tokens already end the answer where it ends
            text = self.tokenizer.decode(self.ids[:k], skip_special_tokens=True)
            return len(text) > len(cut) and cut_at_stop(text, self.stop) == cut

        lo, hi = 0, len(self.ids)  # holds(hi); the shortest such prefix (holds grows with k), in log2(n) decodes
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if holds(mid) else (mid, hi)
        self.ids, self.logprobs, self.completion_tokens = self.ids[:hi], self.logprobs[:hi], hi

    def _finish(self, text: str, reason: str) -> str:
        self.text, self.finish_reason = text, reason
        if not text.startswith(self.sent):  # a tokenizer whose decode is not prefix-stable beyond the held-back tail
            log.warning("streamed text %r is not a prefix of the final answer %r", self.sent, text)
            return ""
        delta, self.sent = text[len(self.sent):], text
        return delta


async def _gone(request: Request) -> None:
    """Returns when the client of ``request`` (its body already read) disconnects: the server's next message then is
    ``http.disconnect`` (as Starlette's streamed responses listen for it)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class _Run:
    """One HTTP request in the engine: its jobs, their text streams and the queue their events arrive on."""

    def __init__(self, scheduler: Scheduler, jobs: list[Job], streams: list[TextStream]) -> None:
        self.scheduler, self.streams = scheduler, streams
        self.ids = [job.request_id for job in jobs]
        self.index = {rid: i for i, rid in enumerate(self.ids)}
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def sink(item: Any) -> None:  # called from the engine thread
            with contextlib.suppress(RuntimeError):  # the loop closed (shutdown): nobody is listening
                loop.call_soon_threadsafe(self.queue.put_nowait, item)

        scheduler.admit(jobs, sink)

    @property
    def done(self) -> bool:
        return all(s.finish_reason is not None for s in self.streams)

    def cancel_unfinished(self) -> None:
        self.scheduler.cancel([rid for rid, s in zip(self.ids, self.streams) if s.finish_reason is None])

    async def next(self, timeout: float) -> tuple[int, str]:
        """(choice index, new text) of the next event; raises `APIError` for an aborted request and
        `TimeoutError` when nothing arrives within ``timeout`` seconds."""
        return self.take(await asyncio.wait_for(self.queue.get(), timeout=timeout))

    def take(self, item: Any) -> tuple[int, str]:
        """(choice index, new text) of an engine event; raises `APIError` for an aborted request."""
        if isinstance(item, Aborted):
            raise item.error
        i = self.index[item.request_id]
        stream = self.streams[i]
        if item.finished:
            if item.finish_reason == "cancelled":  # cancelled by the engine itself, not by this request
                raise APIError(500, "the engine cancelled this request.", type="server_error", code="cancelled")
            if item.finish_reason == "error":  # this request alone failed in the engine; the others go on
                raise APIError(500, f"decoding this request failed ({item.error}); the server log has the details.",
                               type="server_error", code="engine_error")
            return i, stream.finish(item.token_ids, item.finish_reason, item.logprobs)
        delta = stream.update(item.stable_ids, item.logprobs)
        if stream.finish_reason is not None:  # EOS or a stop string in the stable part: the rest cannot change it
            self.scheduler.cancel([item.request_id])
        return i, delta


def _content_chars(content: Any) -> int:
    """Characters of a message's content: a string, or OpenAI's text parts (checked later, by the chat format)."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return 0


def _error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


# every field name a request body may hold, at any depth (what an error's ``param`` may name)
_FIELDS = frozenset(CompletionRequest.model_fields) | set(ChatCompletionRequest.model_fields) | set(
    StreamOptions.model_fields)
_JSON_TYPES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", list: "an array",
               dict: "an object", type(None): "null"}


def _where(loc: Sequence[Any]) -> tuple[str | None, str | None]:
    """(param, union member) of a validation error's location: the field (and the list indices and field names
    below it), without pydantic's tag of the member of a union that was tried (``prompt.str`` is ``prompt``)."""
    parts = [p for p in loc if p != "body"]
    kept: list[str] = []
    for i, p in enumerate(parts):
        if i > 0 and not isinstance(p, int) and p not in _FIELDS:
            return ".".join(kept), str(p)
        kept.append(str(p))
    return ".".join(kept) or None, None


def _validation_error(exc: RequestValidationError) -> APIError:
    """A pydantic/FastAPI validation failure as one OpenAI error naming the field."""
    errors = exc.errors()
    first = errors[0] if errors else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param, member = _where(first.get("loc", ()))
    kind = first.get("type", "")
    if kind == "json_invalid":
        return APIError(400, f"the request body is not valid JSON ({first.get('ctx', {}).get('error', 'parse error')}).",
                        code="invalid_json")
    if kind == "invalid_unicode":
        return APIError(400, f"{first.get('msg', 'invalid text')}", param=first.get("ctx", {}).get("param"),
                        code="invalid_unicode")
    if kind == "extra_forbidden":
        return APIError(400, f"unknown or unsupported field {param!r}: biglm serve refuses options it would ignore "
                             "(see docs/serving.md for the accepted fields).", param=param, code="unknown_field")
    if kind == "missing":
        if param is None:  # the body itself
            return APIError(400, "the request body is empty: send a JSON object with the request's fields (docs/"
                                 "serving.md).", code="invalid_body")
        return APIError(400, f"missing required field {param!r}.", param=param, code="missing_field")
    if not loc:
        return APIError(400, f"the request body must be a JSON object ({first.get('msg', 'invalid body')}).",
                        code="invalid_body")
    value = first.get("input")
    if member is not None:  # a union (prompt: text or token ids): every member refused it
        named = [_where(e.get("loc", ())) for e in errors]
        members = list(dict.fromkeys(m for p, m in named if p == param and m))  # (pydantic's names: list[int], ...)
        kinds = " or ".join(filter(None, [", ".join(members[:-1]), members[-1]]))
        got = "an array of neither" if isinstance(value, list) else _JSON_TYPES.get(type(value), "another value")
        return APIError(400, f"{param} must be {kinds}, got {got}.", param=param, code="invalid_value")
    got = f" (got {json.dumps(value)})" if isinstance(value, (str, int, float)) and len(str(value)) <= 40 else ""
    return APIError(400, f"{param}: {first.get('msg', 'invalid value')}{got}.", param=param, code="invalid_value")


class _JSONBodies:
    """ASGI middleware: a POST body is read as JSON whatever its ``Content-Type`` says (this API takes JSON bodies
    only). curl's ``-d`` sends ``application/x-www-form-urlencoded``, on which FastAPI would not parse the JSON it
    holds and the request was refused as not being a JSON object; a body that is not JSON is still refused as such."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


HealthHook = Callable[[], Awaitable[dict[str, Any]]]
"""Fields a deployment adds to ``GET /health`` (under Ray Serve: the application's state and its replicas). Their
``status`` is the service's: "ok", "degraded" (part of it is down, the rest serves: still 200, so a load balancer
keeps a service that answers) or anything else (nothing serves: 503)."""


def _internal_error(exc: BaseException) -> APIError:
    """An unexpected failure as OpenAI's 500 (the traceback goes to the log, not to the client)."""
    return APIError(500, f"internal server error ({type(exc).__name__}); the server log has the details.",
                    type="server_error", code="internal_error")


def create_app(*, model: Any, tokenizer: Any, settings: ServeSettings, engine: Any = None,
               health: HealthHook | None = None) -> FastAPI:
    """The server for ``model`` (a `BiGLMForMaskedLM` in eval mode) and its ``tokenizer``.

    ``engine`` defaults to a `biglm.generation.engine.DecodeEngine` over ``model``; the engine thread
    starts with the app (lifespan) and stops, aborting what is left, when it shuts down. ``health`` (optional)
    adds the fields of the deployment this app runs in to ``GET /health``.
    """
    if engine is None:
        from ..generation.engine import DecodeEngine

        options = {name: getattr(settings, name) for name in ("prefill_chunk", "draft_rows", "prompt_cache_mb")
                   if getattr(settings, name) is not None}  # unset: the engine's defaults
        engine = DecodeEngine(model, max_batch_rows=settings.max_batch_rows, tokenizer=tokenizer, **options)
    window = int(model.config.max_position_embeddings)
    max_steps = settings.max_steps or window
    max_chars = settings.max_prompt_chars or PROMPT_CHARS_PER_TOKEN * window
    eos_id = model.config.eos_token_id
    scheduler = Scheduler(engine, max_in_flight=settings.max_batch_rows + settings.max_queue)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        scheduler.start()
        try:
            yield
        finally:
            await asyncio.to_thread(scheduler.stop)

    app = FastAPI(title="biglm serve", lifespan=lifespan)
    app.add_middleware(_JSONBodies)
    app.state.scheduler = scheduler
    app.state.settings = settings
    created = now()
    # the errors answered since start, by (status, code, field): /metrics' biglm_errors_total
    errors: collections.Counter[tuple[int, str, str]] = collections.Counter()
    app.state.errors = errors

    def counted(error: APIError) -> APIError:
        field = (error.param or "").split(".")[0]
        errors[error.status, error.code or "", field if field in _FIELDS else ""] += 1  # (never a client's own name)
        return error

    def disconnected() -> None:
        scheduler.stats["disconnects"] += 1
        errors[499, "client_disconnected", ""] += 1

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return _error_response(counted(exc))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error_response(counted(_validation_error(exc)))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # (Starlette logs the traceback after this answer is sent)
        return _error_response(counted(_internal_error(exc)))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return _error_response(counted(APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                                                type=kind)))

    def check_model(name: str | None) -> None:
        if name is not None and name != settings.model_name:
            raise APIError(404, f"the model {name!r} does not exist: this server serves {settings.model_name!r} "
                                "(GET /v1/models).", param="model", code="model_not_found")

    def check_length(chars: int, where: str, param: str) -> None:
        if chars > max_chars:
            default = (f"by default {PROMPT_CHARS_PER_TOKEN} per position of the model's window of {window}"
                       if settings.max_prompt_chars is None else "as set")
            raise APIError(400, f"{where} has {chars} characters, more than this server tokenizes ({max_chars}: "
                                f"`biglm serve --max_prompt_chars`, {default}): shorten the prompt.", param=param,
                           code="context_length_exceeded")

    async def encode(prompts: list[str] | list[list[int]], config: DecodingConfig, body: Any, *,
                     param: str) -> tuple[list[list[int]], list[DecodingConfig]]:
        """Token ids of ``prompts`` (texts, or token ids checked against the vocabulary) and each one's decoding
        settings: their sizes checked first, then tokenized in a worker thread (a long prompt takes milliseconds to
        seconds, which the event loop must not wait for). An answer length the request (``body``) names must fit
        beside its prompt in the model's window (a 400); the server's default answer length shrinks to the rest of
        the window where a prompt leaves less, as vLLM answers a request without ``max_tokens``."""
        limit = "max_tokens" if getattr(body, "max_completion_tokens", None) is None else "max_completion_tokens"
        given = getattr(body, limit) is not None
        if given and config.max_new_tokens >= window:
            raise APIError(400, f"{limit}={config.max_new_tokens} leaves no room for a prompt in the model's "
                                f"window of {window} tokens: ask for fewer.", param=limit, code="invalid_value")
        where = [param if len(prompts) == 1 else f"{param}[{i}]" for i in range(len(prompts))]
        vocab = int(model.config.vocab_size)
        for prompt, w in zip(prompts, where):
            if not prompt:
                raise APIError(400, f"{w} is empty: give the text (or token ids) to continue.", param=param,
                               code="empty_prompt")
            if isinstance(prompt, str):
                check_length(len(prompt), w, param)
            elif not all(0 <= i < vocab for i in prompt):
                bad = next(i for i in prompt if not 0 <= i < vocab)
                raise APIError(400, f"{w} holds the token id {bad}, outside this model's vocabulary [0, {vocab}): "
                                    "send ids of its own tokenizer.", param=param, code="invalid_value")
        encoded = await asyncio.to_thread(
            lambda: [list(tokenizer(p, add_special_tokens=False)["input_ids"]) if isinstance(p, str) else list(p)
                     for p in prompts])
        configs = []
        for ids, where in zip(encoded, where):
            room = window - len(ids)
            if given and config.max_new_tokens > room:
                raise APIError(400, f"{where} has {len(ids)} tokens and {limit}={config.max_new_tokens}: together "
                                    f"{len(ids) + config.max_new_tokens}, more than the model's window of {window}; "
                                    f"shorten the prompt or lower {limit}.", param=param,
                               code="context_length_exceeded")
            if room < 1:
                raise APIError(400, f"{where} has {len(ids)} tokens: it fills the model's window of {window}, leaving "
                                    "no room for an answer; shorten the prompt.", param=param,
                               code="context_length_exceeded")
            try:
                configs.append(config if config.max_new_tokens <= room else
                               dataclasses.replace(config, max_new_tokens=room))
            except (ValueError, TypeError) as e:  # a setting that does not fit the shorter answer
                raise APIError(400, f"{where} leaves {room} tokens of the model's window for the answer, where {e}",
                               param=param, code="invalid_value") from None
        return encoded, configs

    def check_rows(prompts: int, n: int) -> None:
        """Refuse a request with more answers than the server holds at once (before any of it is tokenized)."""
        if prompts * n > scheduler.max_in_flight:
            raise APIError(400, f"{prompts} prompt(s) x n={n} is {prompts * n} answers, more than this server holds "
                                f"at once ({scheduler.max_in_flight}): split the request.", param="n",
                           code="invalid_value")

    def start(prompt_ids: list[list[int]], configs: list[DecodingConfig], n: int, prefix: str, *,
              streamed: bool) -> tuple[str, _Run]:
        rid = new_id(prefix)
        jobs, streams = [], []
        for p, (ids, config) in enumerate(zip(prompt_ids, configs)):
            for j in range(n):
                # choice j of a prompt samples with seed + j: n distinct samples, each one reproducible
                cfg = config if j == 0 else dataclasses.replace(config, seed=(config.seed + j) % SEEDS)
                jobs.append(Job(f"{rid}-{p}-{j}", ids, cfg, final_only=not streamed))
                streams.append(TextStream(tokenizer, eos_id=eos_id, stop=config.stop))
        return rid, _Run(scheduler, jobs, streams)

    def usage(prompt_ids: list[list[int]], run: _Run) -> Usage:
        prompt = sum(len(p) for p in prompt_ids)
        completion = sum(s.completion_tokens for s in run.streams)
        return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)

    async def collect(run: _Run, request: Request) -> bool:
        """Wait for every answer of ``run``; False when the client went away (its requests are cancelled).

        The client's going is heard by one waiter on the connection (`_gone`), not polled: each waiting request
        asked its connection twice a second (`Request.is_disconnected`, anyio cancel scopes: most of the event loop's
        own work in a profile at 32 clients, though little CPU)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + settings.request_timeout
        gone = asyncio.ensure_future(_gone(request))
        try:
            while not run.done:
                left = deadline - loop.time()
                if left <= 0:
                    scheduler.stats["timeouts"] += 1
                    raise APIError(408, f"the request did not finish within {settings.request_timeout:g} s "
                                        "(`biglm serve --request_timeout`): ask for fewer tokens or steps.",
                                   type="timeout", code="request_timeout")
                item = asyncio.ensure_future(run.queue.get())
                await asyncio.wait((item, gone), timeout=left, return_when=asyncio.FIRST_COMPLETED)
                if item.done():  # (an event that came with the disconnect is taken first)
                    run.take(item.result())
                    continue
                item.cancel()
                if gone.done():
                    disconnected()
                    return False
            return True
        finally:
            gone.cancel()
            run.cancel_unfinished()

    async def sse(run: _Run, chunks: Any) -> AsyncIterator[str]:
        """Server-sent events from ``chunks`` (an async iterator of pydantic models), errors as an error
        event, always ending with ``[DONE]``; a disconnect (cancellation) cancels the engine requests."""
        try:
            async for chunk in chunks:  # a pydantic model, or a JSON object (the step stream's events)
                yield f"data: {chunk.model_dump_json() if hasattr(chunk, 'model_dump_json') else json.dumps(chunk)}\n\n"
        except APIError as e:
            yield f"data: {json.dumps(counted(e).body())}\n\n"
        except asyncio.CancelledError:
            disconnected()
            raise
        except Exception as e:  # noqa: BLE001 - the 200 is sent: the error goes in the stream, as OpenAI's
            log.exception("a streamed answer failed")
            yield f"data: {json.dumps(counted(_internal_error(e)).body())}\n\n"
        finally:
            run.cancel_unfinished()
        yield "data: [DONE]\n\n"

    async def events(run: _Run) -> AsyncIterator[tuple[int, str]]:
        """(choice, delta) pairs until every answer finished, or a timeout `APIError`."""
        deadline = asyncio.get_running_loop().time() + settings.request_timeout
        while not run.done:
            left = deadline - asyncio.get_running_loop().time()
            try:
                if left <= 0:
                    raise TimeoutError
                yield await run.next(left)
            except TimeoutError:
                scheduler.stats["timeouts"] += 1
                raise APIError(408, f"the request did not finish within {settings.request_timeout:g} s "
                                    "(`biglm serve --request_timeout`); it was cancelled.", type="timeout",
                               code="request_timeout") from None

    async def reply(body: Any, request: Request, run: _Run, prompt_ids: list[list[int]], *,
                    chunk: Callable[[int, str, str | None], Any], tail: Callable[[Usage], Any],
                    whole: Callable[[Usage], Any], first: Sequence[Any] = ()) -> Any:
        """The answer to a completions or chat request: a stream of ``first``, then ``chunk(choice, delta,
        finish_reason)`` per change and ``tail(usage)`` if asked for; or, not streamed, ``whole(usage)``."""
        if body.stream:
            async def chunks() -> AsyncIterator[Any]:
                for item in first:
                    yield item
                async for i, delta in events(run):
                    reason = run.streams[i].finish_reason
                    if delta or reason is not None:
                        yield chunk(i, delta, reason)
                if body.stream_options is not None and body.stream_options.include_usage:
                    yield tail(usage(prompt_ids, run))

            return StreamingResponse(sse(run, chunks()), media_type="text/event-stream")
        if not await collect(run, request):
            return JSONResponse({}, status_code=499)  # the client is gone; nobody reads this
        return whole(usage(prompt_ids, run))

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        gauges = {"requests_running": scheduler.num_running, "requests_prefilling": scheduler.num_prefilling,
                  "requests_waiting": scheduler.num_waiting, "requests_in_flight": scheduler.in_flight}
        lines = []
        stats = scheduler.stats
        if stats["request_calls"]:  # what a written token cost, over the finished requests
            gauges["tokens_per_call"] = round(stats["tokens_written"] / stats["request_calls"], 4)
            gauges["positions_per_token"] = round(stats["positions"] / max(stats["tokens_written"], 1), 4)
        for name, value in gauges.items():
            lines += [f"# TYPE biglm_{name} gauge", f"biglm_{name} {value}"]
        for name, value in sorted(scheduler.stats.items()):  # counters since start
            lines += [f"# TYPE biglm_{name}_total counter", f"biglm_{name}_total {value}"]
        lines.append("# TYPE biglm_errors_total counter")  # the errors answered, by kind (a 499: the client left)
        lines += [f'biglm_errors_total{{status="{status}",code="{code}",param="{param}"}} {value}'
                  for (status, code, param), value in sorted(errors.items())]
        return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

    @app.get("/health")
    async def health_check() -> JSONResponse:
        state = "draining" if scheduler.draining else ("ok" if scheduler.alive else "engine_down")
        body = {"status": state, "model": settings.model_name, "running": scheduler.num_running,
                "prefilling": scheduler.num_prefilling, "waiting": scheduler.num_waiting,
                "in_flight": scheduler.in_flight, "stats": dict(scheduler.stats)}
        if scheduler.broken:
            body["error"] = scheduler.broken
        if health is not None:
            extra = await health()
            if state == "ok":
                state = extra.get("status", state)
            body.update(extra, status=state)
        return JSONResponse(body, status_code=200 if state in SERVING else 503)

    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=settings.model_name, created=created, max_model_len=window)])

    @app.get("/v1/models/{name}")
    async def model_card(name: str) -> ModelCard:
        check_model(name)
        return ModelCard(id=settings.model_name, created=created, max_model_len=window)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        check_model(body.model)
        check_stream(body)
        check_response_fields(body)
        config = decoding_config(body, base=settings.defaults, max_steps=max_steps,
                                 model_default=settings.model_default)
        with_logprobs = wants_logprobs(body)
        one = isinstance(body.prompt, str) or (bool(body.prompt) and isinstance(body.prompt[0], int))  # text or ids
        prompts = [body.prompt] if one else list(body.prompt)
        if not prompts:
            raise APIError(400, "prompt is an empty list: give at least one prompt.", param="prompt",
                           code="empty_prompt")
        check_rows(len(prompts), body.n)
        prompt_ids, configs = await encode(prompts, config, body, param="prompt")
        echoed = [(p if isinstance(p, str) else tokenizer.decode(p)) if body.echo else "" for p in prompts]
        rid, run = start(prompt_ids, configs, body.n, "cmpl", streamed=bool(body.stream))
        created_at = now()

        def logprobs(i: int) -> CompletionLogprobs | None:
            if not with_logprobs:
                return None
            pieces = run.streams[i].take_logprobs()
            return CompletionLogprobs(tokens=[t for t, _, _ in pieces], token_logprobs=[lp for _, lp, _ in pieces],
                                      top_logprobs=[{t: lp} for t, lp, _ in pieces],
                                      text_offset=[o for _, _, o in pieces])

        def chunk(i: int, text: str, reason: str | None) -> CompletionResponse:
            return CompletionResponse(id=rid, created=created_at, model=settings.model_name, choices=[
                CompletionChoice(index=i, text=text, finish_reason=reason, logprobs=logprobs(i))])

        return await reply(
            body, request, run, prompt_ids, chunk=chunk,
            first=[chunk(i, echoed[i // body.n], None) for i in range(len(run.streams)) if body.echo],
            tail=lambda u: CompletionResponse(id=rid, created=created_at, model=settings.model_name, choices=[],
                                              usage=u),
            whole=lambda u: CompletionResponse(
                id=rid, created=created_at, model=settings.model_name, usage=u,
                choices=[CompletionChoice(index=i, text=echoed[i // body.n] + s.text, finish_reason=s.finish_reason,
                                          logprobs=logprobs(i)) for i, s in enumerate(run.streams)]))

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
        check_model(body.model)
        check_stream(body)
        check_response_fields(body)
        config = decoding_config(body, base=settings.defaults, max_steps=max_steps,
                                 model_default=settings.model_default)
        with_logprobs = wants_logprobs(body)
        check_rows(1, body.n)
        messages = openai_messages(body.messages)
        if isinstance(messages, list):  # the contents alone too long: refused before the template renders them
            check_length(sum(_content_chars(m.get("content")) for m in messages if isinstance(m, dict)),
                         "messages", "messages")
        try:
            prompt = await asyncio.to_thread(render_chat, tokenizer, messages, add_generation_prompt=True)
        except ValueError as e:
            raise APIError(400, str(e), param="messages", code="invalid_messages") from None
        prompt_ids, configs = await encode([prompt], config, body, param="messages")
        rid, run = start(prompt_ids, configs, body.n, "chatcmpl", streamed=bool(body.stream))
        created_at = now()

        def logprobs(i: int) -> ChatLogprobs | None:
            if not with_logprobs:
                return None
            return ChatLogprobs(content=[TokenLogprob(token=t, logprob=lp, bytes=list(t.encode("utf-8")))
                                         for t, lp, _ in run.streams[i].take_logprobs()])

        def chunk(i: int, delta: str | None, reason: str | None) -> ChatCompletionChunk:
            message = ChatDelta(role="assistant", content="") if delta is None else ChatDelta(content=delta)
            return ChatCompletionChunk(id=rid, created=created_at, model=settings.model_name, choices=[
                ChatChunkChoice(index=i, delta=message, finish_reason=reason,
                                logprobs=None if delta is None else logprobs(i))])

        return await reply(
            body, request, run, prompt_ids, chunk=chunk,
            first=[chunk(i, None, None) for i in range(len(run.streams))],  # OpenAI opens each choice with the role
            tail=lambda u: ChatCompletionChunk(id=rid, created=created_at, model=settings.model_name, choices=[],
                                               usage=u),
            whole=lambda u: ChatCompletionResponse(
                id=rid, created=created_at, model=settings.model_name, usage=u,
                choices=[ChatChoice(index=i, message=AssistantMessage(content=s.text), finish_reason=s.finish_reason,
                                    logprobs=logprobs(i)) for i, s in enumerate(run.streams)]))

    # ----- the step stream and the playground (docs/serving.md "The step stream", `playground`)
    mask_id = model.config.mask_token_id
    piece = token_text(tokenizer)

    def one_answer(body: CompletionRequest | ChatCompletionRequest, endpoint: str) -> None:
        """Refuse what the step stream does not draw: it carries one answer's canvas."""
        sent = body.model_fields_set
        if body.n != 1:
            raise APIError(400, f"n={body.n}: {endpoint} draws one answer's canvas; send n=1 or leave it out.",
                           param="n", code="invalid_value")
        if body.stream is False:
            raise APIError(400, f"stream=false: {endpoint} always streams (server-sent events); leave stream out.",
                           param="stream", code="invalid_value")
        for name in ("stream_options", "echo", "logprobs", "top_logprobs"):
            if name in sent and getattr(body, name) is not None and getattr(body, name) is not False:  # (0 asks)
                raise APIError(400, f"{name} is not part of {endpoint} (each step event carries every token's "
                                    "confidence): leave it out.", param=name, code="unsupported_field")

    async def stepped(prompt_ids: list[int], config: DecodingConfig, prefix: str) -> StreamingResponse:
        """The step stream of one answer: a ``steps.start`` event, one ``steps.call`` event per model call (the slots
        of its canvas, `canvas.Frame`, that it changed: `FrameDeltas`), then ``steps.done`` with the text the
        non-streamed API answers for it."""
        rid, created_at = new_id(prefix), now()
        stream = TextStream(tokenizer, eos_id=eos_id, stop=config.stop)
        run = _StepRun(scheduler, Job(f"{rid}-0-0", prompt_ids, config), stream, mask_id)

        async def chunks() -> AsyncIterator[dict[str, Any]]:
            head = {"id": rid, "created": created_at, "model": settings.model_name}
            deltas = FrameDeltas(piece)
            yield {**head, "object": "steps.start", "prompt_tokens": len(prompt_ids),
                   "slots": config.max_new_tokens, "decoding": dataclasses.asdict(config)}
            deadline = asyncio.get_running_loop().time() + settings.request_timeout
            calls = 0
            while not run.done:
                left = deadline - asyncio.get_running_loop().time()
                try:
                    if left <= 0:
                        raise TimeoutError
                    item = await asyncio.wait_for(run.queue.get(), timeout=left)
                except TimeoutError:
                    scheduler.stats["timeouts"] += 1
                    raise APIError(408, f"the request did not finish within {settings.request_timeout:g} s "
                                        "(`biglm serve --request_timeout`); it was cancelled.", type="timeout",
                                   code="request_timeout") from None
                if isinstance(item, Frame):
                    calls += 1
                    yield {**head, "object": "steps.call", **deltas.event(item)}
                    continue
                run.take(item)
                if stream.finish_reason is not None:
                    calls = item.steps  # (equal to the frames sent: each call's frame precedes the step's event)
            tokens = stream.completion_tokens
            yield {**head, "object": "steps.done", "text": stream.text, "finish_reason": stream.finish_reason,
                   "calls": calls, "completion_tokens": tokens,
                   "tokens_per_call": round(tokens / calls, 4) if calls else None,
                   "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": tokens,
                             "total_tokens": len(prompt_ids) + tokens}}

        return StreamingResponse(sse(run, chunks()), media_type="text/event-stream")

    @app.post("/v1/completions/steps")
    async def completion_steps(body: CompletionRequest) -> StreamingResponse:
        check_model(body.model)
        one_answer(body, "/v1/completions/steps")
        check_response_fields(body)
        config = decoding_config(body, base=settings.defaults, max_steps=max_steps,
                                 model_default=settings.model_default)
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            if len(prompt) != 1:
                raise APIError(400, f"prompt holds {len(prompt)} prompts: /v1/completions/steps draws one answer's "
                                    "canvas; send one prompt.", param="prompt", code="invalid_value")
            prompt = prompt[0]
        (prompt_ids,), (config,) = await encode([prompt], config, body, param="prompt")
        return await stepped(prompt_ids, config, "cmpl")

    @app.post("/v1/chat/completions/steps")
    async def chat_completion_steps(body: ChatCompletionRequest) -> StreamingResponse:
        check_model(body.model)
        one_answer(body, "/v1/chat/completions/steps")
        check_response_fields(body)
        config = decoding_config(body, base=settings.defaults, max_steps=max_steps,
                                 model_default=settings.model_default)
        messages = openai_messages(body.messages)
        if isinstance(messages, list):
            check_length(sum(_content_chars(m.get("content")) for m in messages if isinstance(m, dict)),
                         "messages", "messages")
        try:
            prompt = await asyncio.to_thread(render_chat, tokenizer, messages, add_generation_prompt=True)
        except ValueError as e:
            raise APIError(400, str(e), param="messages", code="invalid_messages") from None
        (prompt_ids,), (config,) = await encode([prompt], config, body, param="messages")
        return await stepped(prompt_ids, config, "chatcmpl")

    @app.get("/v1/decoding")
    async def decoding() -> JSONResponse:
        return JSONResponse({"model": settings.model_name, "max_model_len": window, "max_steps": max_steps,
                             "fields": decoding_fields(settings.defaults)})

    def page(name: str) -> Response:
        return Response(asset(name), media_type=FILES[name], headers={"Cache-Control": "no-cache"})

    @app.get("/", include_in_schema=False)
    @app.get("/playground", include_in_schema=False)
    async def playground() -> Response:
        return page("index.html")

    @app.get("/favicon.ico", include_in_schema=False)  # what a browser asks for beside any page it shows
    async def favicon() -> Response:
        return page("favicon.svg")

    @app.get("/playground/{name}", include_in_schema=False)
    async def playground_file(name: str) -> Response:
        if name not in FILES:
            raise APIError(404, f"GET /playground/{name}: no such file (the page's files: {', '.join(FILES)}).",
                           type="not_found_error")
        return page(name)

    return app


class _StepRun(_Run):
    """A `_Run` of one answer whose engine request also sends its canvas after every model call (a `canvas.Frame`,
    recorded in the engine's thread) onto the same queue, before that step's engine event."""

    def __init__(self, scheduler: Scheduler, job: Job, stream: TextStream, mask_id: int) -> None:
        loop = asyncio.get_running_loop()

        def on_frame(frame: Frame) -> None:  # called from the engine thread, after `_Run` made the queue
            with contextlib.suppress(RuntimeError):  # the loop closed (shutdown): nobody is listening
                loop.call_soon_threadsafe(self.queue.put_nowait, frame)

        recorder = CanvasRecorder(mask_id, on_frame=on_frame, keep=False)
        super().__init__(scheduler, [dataclasses.replace(job, on_step=recorder)], [stream])
