"""`biglm serve RUN_OR_HF_DIR`: an OpenAI-compatible HTTP server for a BiGLM (FastAPI + uvicorn).

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (the model's chat template),
``GET /v1/models``, ``GET /health``, the step stream (``POST /v1/completions/steps``, ``/v1/chat/completions/steps``:
the answer's canvas after every model call) and ``GET /v1/decoding``, and the playground page at ``/`` that draws it
(its address is printed at start); see docs/serving.md. Call it with the `openai` client::

    client = openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
    client.completions.create(model=NAME, prompt="Once upon a time", max_tokens=32, extra_body={"steps": 8})

The options are the fields of `ServeArgs`, parsed by `biglm.config` like every command and checked
before the model loads; ``--decoding.FIELD`` sets the server's default for a decoding option that a
request leaves out (any `DecodingConfig` field, e.g. ``--decoding.strategy confidence``). A fine-tuned model's
saved decoding settings (answer length, steps, length beam) are the defaults of the options not given, as in
`biglm generate` and `biglm chat` (`biglm.generation.config.model_decoding`).

Shutdown (Ctrl-C / SIGTERM) drains: the server keeps listening and answers new requests 503 ``shutting_down``
(/health 503 "draining": a load balancer moves on, a client is told why, not refused a connection) while the
requests in flight finish, for at most ``--shutdown_timeout`` seconds; then the rest are cancelled (a 503 error,
or an error event in a stream), the engine thread stops and the process exits. A second signal stops at once.
Exit codes: 0 after a clean shutdown, 2 bad arguments, a port it cannot listen on (checked before the model
loads) or a model that does not load.

``--replicas N`` serves the same app from N replicas on Ray Serve (`biglm.integrations.ray_serve`, imported only
then): each replica one model and one engine (``--replica_cpus``/``--replica_gpus`` each), autoscaled between
``--min_replicas`` and ``--max_replicas`` on queue length when they differ, on a local Ray instance or, with
``--ray_address HOST:PORT|auto``, on an existing cluster; ``/health`` then lists the replicas.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from ..config import ConfigError, given_options, parse_cli
from ..generation.cli import ReplicaOptions, ray_integration
from ..generation.config import FIELDS, DecodingConfig, model_decoding, model_default_fields
from ..generation.engine import DEFAULT_DRAFT_ROWS, DEFAULT_PREFILL_CHUNK, DEFAULT_PROMPT_CACHE_MB

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServeArgs(ReplicaOptions):
    """Serve a BiGLM over an OpenAI-compatible HTTP API (completions, chat completions, models, health),
    batching concurrent requests between decoding steps; with --replicas N, as a Ray Serve application."""

    checkpoint: str = ""
    """exported Hugging Face directory, training run or checkpoint directory"""
    host: str = "127.0.0.1"
    """address to listen on (0.0.0.0: every interface)"""
    port: int = 8000
    """TCP port"""
    model_name: str | None = None
    """the model id clients name in requests and /v1/models lists (unset: the checkpoint directory's name)"""
    max_batch_rows: int = 64
    """answers decoded together in one batched model call; more wait in the queue"""
    max_queue: int = 256
    """answers waiting beyond the running batch; a request that does not fit is answered 429 at once"""
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK
    """prompt encoding per engine step, in prompt tokens through every layer: a longer prompt is encoded over several
    steps beside the running requests' decoding (exactly: by layers, see docs/serving.md), so it does not stall them"""
    draft_rows: int = DEFAULT_DRAFT_ROWS
    """rows up to which an engine step drafts with the model (speculative decoding: checked drafts are nearly free
    while a call is bound by reading the weights); above it speculative requests run without the model's mask drafts
    and new exact ones as one token per call, the same answers (0: never draft with the model)"""
    prompt_cache_mb: float = DEFAULT_PROMPT_CACHE_MB
    """memory for the encoded caches of recent prompts: a prompt sent again is not encoded again (whole prompts only: a
    BiGLM prompt is bidirectional, so a shared beginning is not reusable; the same answers); 0: off"""
    request_timeout: float = 600.0
    """seconds a request may take before it is cancelled (408, or an error event in a stream)"""
    shutdown_timeout: float = 30.0
    """on shutdown, seconds in-flight requests get to finish before they are cancelled"""
    max_steps: int | None = None
    """most model calls a request may ask for (unset: the model's window)"""
    max_prompt_chars: int | None = None
    """longest prompt in characters, checked before it is tokenized (unset: 32 per position of the model's window)"""
    device: str = "cuda" if torch.cuda.is_available() else "cpu"
    """where the model runs"""
    threads: int | None = None
    """CPU threads of the model's calls (unset: every core but one, which is left to the HTTP front end and to
    tokenizing, as vLLM's CPU build leaves it; with --replicas each replica has --replica_cpus)"""
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """weights' dtype (unset: the checkpoint's)"""
    compile: bool = False
    """torch.compile each decoder layer (dynamic shapes: compiled once, at the first call, instead of the prepacked
    CPU kernels); for accelerators: on a CPU at batch 1 the default prepacked eager path is faster (docs/LOG.md)"""
    batch_invariant: bool = False
    """each answer independent of the others decoded beside it (kernels whose rows do not depend on the other rows:
    the same answer alone, batched or under any load); bfloat16 weights on a CPU, without --compile; about 4% fewer
    tokens/s alone, 9% at 32 concurrent requests (docs/serving.md)"""
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    """uvicorn's log level"""
    decoding: DecodingConfig = field(default_factory=DecodingConfig)
    """defaults for the decoding options a request leaves out (--decoding.FIELD)"""
    min_replicas: int | None = None
    """with --replicas: Ray Serve scales the replicas on queue length down to this many (unset: --replicas)"""
    max_replicas: int | None = None
    """with --replicas: Ray Serve scales the replicas on queue length up to this many (unset: --replicas)"""

    def __post_init__(self) -> None:
        self.check_replicas()
        if self.replicas is None and (self.min_replicas is not None or self.max_replicas is not None):
            raise ConfigError("--min_replicas/--max_replicas go with --replicas N (the replicas Ray Serve starts with)")
        if self.replicas is not None:
            lo = self.replicas if self.min_replicas is None else self.min_replicas
            hi = self.replicas if self.max_replicas is None else self.max_replicas
            if lo < 1:
                raise ConfigError(f"--min_replicas {lo} must be >= 1")
            if self.min_replicas is not None and self.max_replicas is not None and lo > hi:
                raise ConfigError(f"--min_replicas {lo} exceeds --max_replicas {hi}")
            if not lo <= self.replicas <= hi:
                raise ConfigError(f"--replicas {self.replicas} (the replicas to start with) must lie in "
                                  f"[--min_replicas {lo}, --max_replicas {hi}]")
        if self.batch_invariant and (self.compile or self.device != "cpu"):
            raise ConfigError("--batch_invariant runs on a CPU without --compile (its kernels are measured "
                              "row-invariant there): drop --compile / pass --device cpu, or drop --batch_invariant")
        if not self.checkpoint:
            raise ConfigError("missing RUN_OR_HF_DIR: a directory written by `biglm export` or `biglm pretrain`")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port {self.port} must lie in [0, 65535] (0: any free port)")
        for name in ("max_batch_rows", "max_queue", "prefill_chunk"):
            if getattr(self, name) < (0 if name == "max_queue" else 1):
                raise ConfigError(f"--{name} {getattr(self, name)} must be >= {0 if name == 'max_queue' else 1}")
        if self.draft_rows < 0:
            raise ConfigError(f"--draft_rows {self.draft_rows} must be >= 0 (0: never draft with the model)")
        if not 0 <= self.prompt_cache_mb < float("inf"):
            raise ConfigError(f"--prompt_cache_mb {self.prompt_cache_mb} must be a finite number >= 0 (0: no prompt "
                              "cache)")
        for name in ("request_timeout", "shutdown_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"--{name} {getattr(self, name)} must be > 0 seconds")
        if self.threads is not None and (self.threads < 1 or self.replicas is not None):
            raise ConfigError(f"--threads {self.threads}: " + ("must be >= 1" if self.threads < 1 else
                              "applies to one process; with --replicas each replica has --replica_cpus threads"))
        for name in ("max_steps", "max_prompt_chars"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"--{name} {getattr(self, name)} must be >= 1 (or unset for the model's window)")
        if self.model_name is not None and not self.model_name.strip():
            raise ConfigError("--model_name is empty: give the id clients will send, or leave it unset")


class BiglmServer:
    """uvicorn's server for a `create_app` app, with the drain-then-cancel shutdown described above.

    ``run()`` blocks (the CLI); ``start()`` / ``stop()`` run it in a thread (tests, benchmarks) and
    ``port`` is the bound port (useful with port 0).
    """

    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int = 0, shutdown_timeout: float = 30.0,
                 log_level: str = "warning") -> None:
        import uvicorn

        from .protocol import APIError

        scheduler = app.state.scheduler
        grace = shutdown_timeout

        class _Server(uvicorn.Server):
            draining_since: float | None = None

            def handle_exit(self, sig: int, frame: Any) -> None:
                """The first signal drains (`on_tick` ends the serving once nothing is in flight); uvicorn's own
                handling would close the listening socket at once, so new requests were refused a connection."""
                if self.draining_since is None and not self.should_exit:
                    self.draining_since = time.monotonic()
                    scheduler.draining = True  # new requests: 503; /health: draining
                    log.warning("shutting down: new requests get 503 while %d in flight finish (at most %g s; "
                                "signal again to stop now)", scheduler.in_flight, grace)
                    return
                super().handle_exit(sig, frame)

            async def on_tick(self, counter: int) -> bool:
                if await super().on_tick(counter):
                    return True
                if self.draining_since is None:
                    return False
                if scheduler.in_flight and time.monotonic() - self.draining_since < grace:
                    return False
                n = scheduler.abort_all(APIError(503, f"the server shut down; this request did not finish within "
                                                      f"{grace:g} s.", type="server_unavailable", code="shutting_down"))
                if n:
                    log.warning("shutdown: cancelled %d request(s) still running after %g s", n, grace)
                self.draining_since = -grace  # (the grace is spent: shutdown cancels what is left at once)
                return True

            async def shutdown(self, sockets: Any = None) -> None:
                scheduler.draining = True  # new requests on open connections: 503

                async def cancel_late() -> None:
                    await asyncio.sleep(grace if self.draining_since is None else 0.5)
                    n = scheduler.abort_all(APIError(503, f"the server shut down; this request did not finish within "
                                                          f"{grace:g} s.", type="server_unavailable",
                                                     code="shutting_down"))
                    if n:
                        log.warning("shutdown: cancelled %d request(s) still running after %g s", n, grace)

                late = asyncio.create_task(cancel_late())
                try:
                    await super().shutdown(sockets)
                finally:
                    late.cancel()

        # uvicorn's own deadline is a backstop: by then the aborted requests have answered
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=grace + 5,
                                lifespan="on")
        self.server = _Server(config)
        self._thread: Any = None

    def run(self) -> None:
        self.server.run()

    @property
    def port(self) -> int:
        (server,) = self.server.servers
        return int(server.sockets[0].getsockname()[1])

    def start(self, *, timeout: float = 60.0) -> BiglmServer:
        import threading
        import time

        self._thread = threading.Thread(target=self.server.run, name="biglm-serve", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start (see the log above)")
            time.sleep(0.02)
        return self

    def stop(self, *, timeout: float = 60.0) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)


def given_decoding(args: ServeArgs, given: Collection[str] | None = None) -> dict[str, Any]:
    """The ``--decoding.FIELD`` options given (``given``; unset: those that differ from `DecodingConfig`'s defaults)."""
    if given is None:
        plain = DecodingConfig()
        given = [name for name in FIELDS if getattr(args.decoding, name) != getattr(plain, name)]
    return {name: getattr(args.decoding, name) for name in given}


def server_defaults(config: Any, args: ServeArgs, *, given: Collection[str] | None = None) -> DecodingConfig:
    """The server's decoding defaults for a model of ``config`` (see `build_app`), or a `ValueError` naming the
    option that does not fit the model."""
    defaults = model_decoding(config, given_decoding(args, given),
                              clear="--decoding.{name} {value}")
    window = config.max_position_embeddings
    if defaults.max_new_tokens >= window:
        raise ValueError(f"--decoding.max_new_tokens {defaults.max_new_tokens} leaves no room for a prompt in "
                         f"the model's window of {window} tokens")
    if args.max_steps is not None and defaults.steps is not None and defaults.steps > args.max_steps:
        raise ValueError(f"--decoding.steps {defaults.steps} (the model's saved setting unless given) exceeds "
                         f"--max_steps {args.max_steps}: raise --max_steps or lower --decoding.steps")
    return defaults


def check_model_options(args: ServeArgs, *, given: Collection[str] | None = None) -> DecodingConfig:
    """`server_defaults` from the model's config alone (its weights stay on disk): what a launcher checks before
    it starts replicas that each load the model."""
    from ..checkpoint.loading import model_source
    from ..model import BiGLMConfig

    path = Path(args.checkpoint)
    if (path / "task.json").is_file() and (path / "best" / "config.json").is_file():
        path = path / "best"  # a fine-tuning run: its best epoch's export, as `load_model` reads it
    config_dir = path if (path / "config.json").is_file() else model_source(path).config_dir
    return server_defaults(BiGLMConfig.from_pretrained(config_dir), args, given=given)


def build_app(args: ServeArgs, *, given: Collection[str] | None = None, health: Any = None) -> Any:
    """Load the model of ``args`` and return the app (raises FileNotFoundError/OSError/ValueError).

    The server's decoding defaults are `model_decoding`'s, as in `biglm generate`: the settings a fine-tuned
    model was saved with, under the ``--decoding`` fields named in ``given`` (the CLI passes the flags it was
    given; unset: the fields of ``args.decoding`` that differ from `DecodingConfig`'s defaults)."""
    from ..checkpoint import load_model
    from .app import ServeSettings, create_app

    path = Path(args.checkpoint)
    model, tokenizer = load_model(path, device=args.device, dtype=_DTYPES.get(args.dtype) if args.dtype else None,
                                  pack=True, compile=args.compile, batch_invariant=args.batch_invariant)
    defaults = server_defaults(model.config, args, given=given)
    model_default = model_default_fields(model.config, given_decoding(args, given))
    name = args.model_name or path.resolve().name
    settings = ServeSettings(model_name=name, max_batch_rows=args.max_batch_rows, max_queue=args.max_queue,
                             request_timeout=args.request_timeout, max_steps=args.max_steps,
                             max_prompt_chars=args.max_prompt_chars, defaults=defaults, prefill_chunk=args.prefill_chunk,
                             draft_rows=args.draft_rows, prompt_cache_mb=args.prompt_cache_mb,
                             model_default=model_default)
    return create_app(model=model, tokenizer=tokenizer, settings=settings, health=health)


def cpu_threads(args: ServeArgs, *, cores: int | None = None) -> int:
    """The threads of a CPU server's model calls: ``--threads``, else every core but one. torch's default (every
    core) leaves none to the HTTP front end and the tokenizer: on a 2-core machine it served 7.5x slower."""
    return args.threads or max(1, (cores or os.cpu_count() or 2) - 1)


def port_in_use(host: str, port: int) -> str | None:
    """Why the server could not listen on ``host:port`` (bound as uvicorn binds it), or None when it can: checked
    before the model loads, which takes seconds to minutes, only to fail then."""
    if port == 0:
        return None
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(address)
    except OSError as e:
        return e.strerror or str(e)
    return None


def playground_url(host: str, port: int) -> str:
    """The page to open (the playground at /): an address that listens on every interface is opened on this machine."""
    host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/"


def main(argv: list[str]) -> int:
    """Entry point of `biglm serve`; ``argv`` excludes the word "serve"."""
    try:
        args = parse_cli(ServeArgs, argv, prog="biglm serve", doc=__doc__, positionals=("checkpoint",))
    except SystemExit as e:  # --help (0) or a bad option (2, message printed)
        return int(e.code or 0)
    path = Path(args.checkpoint)
    if not path.exists():
        print(f"biglm serve: no model at {path}: pass a directory written by `biglm export` or `biglm pretrain` "
              "(or a Hugging Face model directory).", file=sys.stderr)
        return 2
    given = list(given_options(ServeArgs, argv).get("decoding") or {})
    if args.replicas is None or args.ray_address is None:  # (on a cluster the port is the head node's)
        busy = port_in_use(args.host, args.port)
        if busy is not None:
            print(f"biglm serve: cannot listen on {args.host}:{args.port} ({busy}): stop what uses it or pick "
                  "another --port.", file=sys.stderr)
            return 2
    if args.replicas is not None:
        return _main_replicas(args, argv, given)
    try:  # the options against the model's config first: an option error is not a model that cannot load
        check_model_options(args, given=given)
    except ValueError as e:
        print(f"biglm serve: {e}", file=sys.stderr)
        return 2
    except (FileNotFoundError, OSError):
        pass  # reported below, by the load itself
    if torch.device(args.device).type == "cpu":
        torch.set_num_threads(cpu_threads(args))
    try:
        app = build_app(args, given=given)
    except (FileNotFoundError, OSError, ValueError) as e:
        print(f"biglm serve: cannot load {path}: {e}", file=sys.stderr)
        return 2
    server = BiglmServer(app, host=args.host, port=args.port, shutdown_timeout=args.shutdown_timeout,
                         log_level=args.log_level)
    print(f"biglm serve: {app.state.settings.model_name} on http://{args.host}:{args.port}/v1 "
          f"(max_batch_rows={args.max_batch_rows}, max_queue={args.max_queue})", file=sys.stderr, flush=True)
    print(f"biglm serve: playground at {playground_url(args.host, args.port)}", file=sys.stderr, flush=True)
    server.run()
    return 0


def _main_replicas(args: ServeArgs, argv: list[str], given: list[str]) -> int:
    """`biglm serve --replicas N`: the same app as the ingress of a Ray Serve application (`biglm.integrations`)."""
    ray_serve = ray_integration("ray_serve", given=given_options(ServeArgs, argv), prog="biglm serve")
    return 2 if ray_serve is None else ray_serve.main(args, given=given)
