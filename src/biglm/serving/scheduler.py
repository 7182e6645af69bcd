"""The loop that drives the decoding engine for the server: one background thread, many requests.

Why a thread: a model call blocks for milliseconds to seconds, and the HTTP side (asyncio, in
uvicorn's event loop) must keep accepting, streaming and refusing requests meanwhile. So the
engine (`biglm.generation.engine.DecodeEngine`) is owned by one thread and touched by no other;
requests reach it through a locked inbox, and its events go back to each request's asyncio queue
through ``loop.call_soon_threadsafe`` (the ``sink`` a request registers).

Batching between decoding steps: each turn of the loop hands the engine the requests that arrived
since the last step (and the cancels), then calls ``engine.step()`` once, one batched model call in
which newly admitted requests join the running ones. The engine holds at most ``max_batch_rows``
running requests; the rest wait inside it.

Bounded: at most ``max_batch_rows + max_queue`` engine requests are in flight (submitted, not
finished). `admit` refuses beyond that at once (429), and while draining for shutdown or after the
engine failed (503), so an overloaded server answers instead of hanging.

Failure domains: an error the engine attributes to one request (finish_reason "error": its start, its sampling)
ends that request alone; only an exception out of ``engine.step()`` itself (the merged model call) fails every
request in flight.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..generation.config import DecodingConfig
from .protocol import APIError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Job:
    """One engine request: one prompt, one choice."""

    request_id: str
    prompt_ids: list[int]
    config: DecodingConfig
    on_step: Callable[[Any], None] | None = None  # each model call's `StepInfo`, in the engine's thread (step stream)
    final_only: bool = False
    """Deliver only the finishing event (a reply that is not streamed): no event crosses to the event loop per step,
    where 32 running requests cost 32 wake-ups and 32 re-decodings of their text at every call. (The engine itself
    ends a request at its EOS or stop string.)"""


@dataclass(frozen=True)
class Aborted:
    """Sent to a request's sink instead of further events: the request ended with ``error``."""

    request_id: str
    error: APIError


Sink = Callable[[Any], None]  # receives EngineEvent or Aborted items; must be thread-safe


class Scheduler:
    """Owns ``engine`` in a background thread; see the module docstring."""

    def __init__(self, engine: Any, *, max_in_flight: int) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight={max_in_flight} must be >= 1.")
        self.engine = engine
        self.max_in_flight = max_in_flight
        self._cond = threading.Condition()
        self._submits: list[Job] = []
        self._cancels: list[str] = []
        self._sinks: dict[str, Sink] = {}  # live requests (their slots count as in flight)
        # submitted to the engine and not yet finished there -> whether its sink hears only the finishing event
        self._in_engine: dict[str, bool] = {}
        self._stop = False
        self.draining = False
        self.broken: str | None = None  # why the engine cannot serve any more
        self.stats: collections.Counter[str] = collections.Counter()
        self.num_running = 0  # the engine's counts after the last turn (read by /health)
        self.num_waiting = 0
        self.num_prefilling = 0  # among the running: prompts being encoded over several steps
        self._thread = threading.Thread(target=self._run, name="biglm-engine", daemon=True)

    # ----- called from the event loop ----------------------------------------------------------

    @property
    def in_flight(self) -> int:
        with self._cond:
            return len(self._sinks)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.broken is None

    def start(self) -> None:
        self._thread.start()

    def admit(self, jobs: list[Job], sink: Sink) -> None:
        """Queue ``jobs`` (all or none) for the next step, or raise a 429/503 `APIError` at once."""
        with self._cond:
            if self.draining or self._stop:
                self.stats["rejected_503"] += 1
                raise APIError(503, "the server is shutting down: retry on another replica or later.",
                               type="server_unavailable", code="shutting_down")
            if self.broken is not None or not self._thread.is_alive():
                self.stats["rejected_503"] += 1
                raise APIError(503, f"the decoding engine is not running ({self.broken or 'not started'}).",
                               type="server_unavailable", code="engine_unavailable")
            if len(self._sinks) + len(jobs) > self.max_in_flight:
                self.stats["rejected_429"] += 1
                raise APIError(429, f"the server is at capacity ({len(self._sinks)} requests in flight, at most "
                                    f"{self.max_in_flight} = max_batch_rows + max_queue): retry later.",
                               type="rate_limit_exceeded", code="queue_full")
            for job in jobs:
                self._sinks[job.request_id] = sink
            self._submits.extend(jobs)
            self.stats["admitted"] += len(jobs)
            self._cond.notify()

    def cancel(self, request_ids: list[str]) -> None:
        """Stop ``request_ids`` (a disconnect, a timeout, a stop string reached); their slots free at once."""
        with self._cond:
            for rid in request_ids:
                if self._sinks.pop(rid, None) is not None:
                    self._cancels.append(rid)
                    self.stats["cancelled"] += 1
            self._cond.notify()

    def abort_all(self, error: APIError) -> int:
        """End every live request with ``error`` (shutdown past its grace period); returns how many."""
        with self._cond:
            live = list(self._sinks.items())
            self._sinks.clear()
            self._cancels.extend(rid for rid, _ in live)
            self.stats["aborted"] += len(live)
            self._cond.notify()
        for rid, sink in live:
            sink(Aborted(rid, error))
        return len(live)

    def stop(self, *, timeout: float = 10.0) -> None:
        """Abort what is left, end the thread and wait for it (the model call in progress finishes first)."""
        self.abort_all(APIError(503, "the server shut down before this request finished.",
                                type="server_unavailable", code="shutting_down"))
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # ----- the engine thread -------------------------------------------------------------------

    def _has_work(self) -> bool:
        return bool(self._submits or self._cancels or self.engine.num_running or self.engine.num_waiting)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stop and not self._has_work():
                    self._cond.wait()
                if self._stop:
                    self._release()
                    return
                submits, self._submits = self._submits, []
                cancels, self._cancels = self._cancels, []
            try:
                self._turn(submits, cancels)
            except Exception as e:  # noqa: BLE001 - whatever the engine raised, the requests must hear of it
                self._fail_all(e)
                if self.broken is not None:
                    return  # /health and new requests answer 503 from now on

    def _turn(self, submits: list[Job], cancels: list[str]) -> None:
        engine = self.engine
        for rid in cancels:
            if rid in self._in_engine:
                engine.cancel(rid)
                del self._in_engine[rid]
        for job in submits:
            with self._cond:
                sink = self._sinks.get(job.request_id)
            if sink is None:
                continue  # cancelled before it reached the engine
            try:
                engine.submit(job.request_id, job.prompt_ids, job.config,
                              **({} if job.on_step is None else {"on_step": job.on_step}))
            except ValueError as e:  # the engine refused this request's settings: only it fails
                with self._cond:
                    self._sinks.pop(job.request_id, None)
                sink(Aborted(job.request_id, APIError(400, str(e), code="invalid_value")))
                continue
            self._in_engine[job.request_id] = job.final_only
        events = engine.step() if engine.num_running or engine.num_waiting else []
        self.stats["steps"] += bool(events)
        self.stats["positions"] = getattr(engine, "positions", 0)  # what the steps computed (benchmarks' cost)
        for event in events:
            if not event.finished and self._in_engine.get(event.request_id):
                continue
            if event.finished:
                self._in_engine.pop(event.request_id, None)
                if event.finish_reason != "error":  # tokens written, and the calls that wrote them (tokens per call)
                    self.stats["tokens_written"] += len(event.token_ids)
                    self.stats["request_calls"] += event.steps
            with self._cond:
                sink = self._sinks.pop(event.request_id, None) if event.finished else self._sinks.get(event.request_id)
            if event.finish_reason == "error":  # this request alone failed (the engine dropped it; the rest go on)
                log.error("request %s failed in the engine: %s", event.request_id, event.error)
                self.stats["request_errors"] += 1
            if sink is not None:
                if event.finished and event.finish_reason != "error":
                    self.stats["finished"] += 1
                sink(event)
        self._count()

    def _count(self) -> None:
        """The engine's counts for /health and /metrics (running includes those whose prompt is being encoded)."""
        e = self.engine
        self.num_running, self.num_waiting = e.num_running, e.num_waiting
        self.num_prefilling = getattr(e, "num_prefilling", 0)
        self.stats["prefill_work"] = getattr(e, "prefill_work", 0)  # prompt token-layers encoded
        cache = getattr(e, "prompt_cache", None)
        if cache is not None:  # prompts sent again, not encoded again
            self.stats["prompt_cache_hits"] = cache.hits

    def _release(self) -> None:
        """On stop: drop what is still in the engine (its sinks were aborted), so it is left empty."""
        for rid in list(self._in_engine):
            self.engine.cancel(rid)
        self._in_engine.clear()
        self._count()

    def _fail_all(self, error: Exception) -> None:
        log.exception("decoding engine failed; failing its requests")
        self.stats["engine_errors"] += 1
        with self._cond:
            live = list(self._sinks.items())
            self._sinks.clear()
        failure = APIError(500, f"the decoding engine failed: {type(error).__name__}: {error}", type="server_error",
                           code="engine_error")
        for rid, sink in live:
            sink(Aborted(rid, failure))
        try:  # leave the engine empty for the next requests
            for rid in list(self._in_engine):
                self.engine.cancel(rid)
            self._in_engine.clear()
            if self.engine.num_running or self.engine.num_waiting:
                self.engine.step()
        except Exception as e:  # noqa: BLE001
            self.broken = f"{type(e).__name__}: {e}"
            log.exception("decoding engine cannot recover; the server now answers 503")
        self._count()
