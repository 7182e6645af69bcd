"""`biglm serve --replicas N` on Ray Serve: the OpenAI-compatible app of `biglm.serving` as the ingress of a Ray
Serve application whose N replicas each hold one model and one `DecodeEngine`.

Why this shape: each replica is the whole single-process server (`serving.cli.build_app`: the FastAPI app, its
scheduler thread and engine), so everything it does alone it does under Ray unchanged: the same validation and
errors, streaming, requests batched between decoding steps, its own 429 when its queue is full. Ray Serve's proxy
takes the HTTP connections and routes each request to a replica (power of two choices on queue length); Ray Serve
also restarts a replica that dies, scales between ``--min_replicas`` and ``--max_replicas`` on its queue length
(`autoscaling`), and drains a replica it stops. Nothing here re-implements any of that.

Notable features
- ``GET /health`` adds the application's state (Ray Serve's, "RUNNING" when every replica is up), the replica that
  answered, and ``replicas``: ``{"id", "state", "served", "pid", "node"}`` for each replica the Serve controller
  lists, ``served`` counting the completions and chat requests that replica answered with a success. The counts
  live in one small actor (`ServedBoard`), since a replica can only see its own. Its status is `replica_health`'s:
  "degraded" (200) while some replicas serve and another is starting or being replaced, so a load balancer keeps a
  service that answers; 503 only when none serves.
- Faults: a killed replica's requests end as Ray Serve's proxy ends them (a 500, which the `openai` client retries;
  a stream already started is cut); the controller notices the death within ``HEALTH_CHECK_S`` seconds and starts a
  replacement while the others keep serving. A replica whose engine broke fails its health check and is replaced.
- Overload: a replica takes up to ``max_batch_rows + max_queue`` requests (plus a few for /health), refusing more
  with its own 429; requests no replica can take wait in Ray Serve's queue up to ``max_queue`` per replica, then get
  Ray Serve's 503 at once.
- Shutdown (Ctrl-C / SIGTERM), as in one process: the replicas answer new requests 503 while those in flight get
  ``--shutdown_timeout`` seconds to finish, then the rest are cancelled (503) and the application is deleted; exit
  status 0. The launcher tells the replicas through the board, which each polls every ``POLL_S`` seconds. A signal
  while it starts stops it once started (Ray and the replicas start in a thread: the main thread only waits, free
  to take the signal, and Ray installs no handler of its own). If Ray's processes died with the signal (sent to the
  whole process group), the launcher stops waiting for them after ``RAY_CALL_S`` seconds.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import sys
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray import serve

from ..serving.cli import ServeArgs, build_app, check_model_options, playground_url
from .ray_cluster import ClusterError, connect, disconnect, limit_threads, replica_device

DEPLOYMENT = "biglm"
HEALTH_CHECK_S = 2.0  # how often the controller checks each replica (and so notices a dead one)
POLL_S = 0.25  # how often a replica reads the shutdown phase
HEALTH_ROOM = 8  # requests a full replica still takes beyond its queue: /health and the 429s it answers itself
SERVED_PATHS = ("/v1/completions", "/v1/chat/completions")
RAY_CALL_S = 10.0  # the launcher's wait for one answer from Ray while it shuts down (Ray itself may be gone)


@ray.remote(num_cpus=0)
class ServedBoard:
    """What the replicas share with each other and the launcher: requests answered per replica id (/health reads
    them all), and the shutdown phase ("serving", "draining", "cancel") each replica polls with its requests in
    flight."""

    def __init__(self) -> None:
        self.served: dict[str, int] = {}
        self.in_flight: dict[str, tuple[int, float]] = {}  # replica id -> (requests in flight, when it said so)
        self.phase = "serving"

    def add(self, replica_id: str) -> None:
        self.served[replica_id] = self.served.get(replica_id, 0) + 1

    def counts(self) -> dict[str, int]:
        return dict(self.served)

    def poll(self, replica_id: str, in_flight: int) -> str:
        self.in_flight[replica_id] = (in_flight, time.monotonic())
        return self.phase

    def set_phase(self, phase: str) -> None:
        self.phase = phase

    def busy(self) -> int:
        """Requests in flight on the replicas that polled lately (a dead one stops counting)."""
        now = time.monotonic()
        return sum(n for n, when in self.in_flight.values() if now - when < 4 * POLL_S)


class _CountServed:
    """ASGI middleware: after a completions or chat request is answered with a success (a stream: to its end),
    ``on_served()``; a refusal (429, 400, ...) is not counted."""

    def __init__(self, app: Any, on_served: Any) -> None:
        self.app, self.on_served = app, on_served

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if not (scope["type"] == "http" and scope.get("method") == "POST" and scope.get("path") in SERVED_PATHS):
            await self.app(scope, receive, send)
            return
        status = 0

        async def send_seen(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        await self.app(scope, receive, send_seen)
        if 200 <= status < 300:
            self.on_served()


@serve.ingress()
class BiglmReplica:
    """One replica: the model, its engine thread and the whole FastAPI app of `biglm serve`."""

    def __init__(self, args: ServeArgs, given: list[str], board: Any) -> None:
        limit_threads(args.replica_cpus)
        context = serve.get_replica_context()
        self.id, self.app_name, self.deployment = context.replica_tag, context.app_name, context.deployment
        self.board, self.controller = board, None
        local = dataclasses.replace(args, device=replica_device(args.replica_gpus), replicas=None, replica_cpus=1,
                                    replica_gpus=0.0, ray_address=None, min_replicas=None, max_replicas=None)
        self.server = build_app(local, given=given, health=self.cluster_health)
        self.server.add_middleware(_CountServed, on_served=lambda: self.board.add.remote(self.id))
        self.scheduler = self.server.state.scheduler
        threading.Thread(target=self._follow_phase, name="biglm-phase", daemon=True).start()

    def _follow_phase(self) -> None:
        """The launcher's shutdown, as `serving.cli.BiglmServer` does it in one process: "draining" refuses new
        requests (503) while those in flight finish; "cancel" ends the rest (503)."""
        from ..serving.protocol import APIError

        cancelled = False
        while True:
            try:
                phase = ray.get(self.board.poll.remote(self.id, self.scheduler.in_flight), timeout=10)
            except Exception:  # noqa: BLE001 - no board (its launcher is gone): keep serving
                phase = "serving"
            if phase != "serving":
                self.scheduler.draining = True
            if phase == "cancel" and not cancelled:
                cancelled = True
                self.scheduler.abort_all(APIError(503, "the server shut down; this request did not finish in time.",
                                                  type="server_unavailable", code="shutting_down"))
            time.sleep(POLL_S)

    def __serve_build_asgi_app__(self) -> Any:
        return self.server

    def check_health(self) -> None:
        """Ray Serve's periodic check: a replica whose engine cannot serve any more is replaced."""
        if self.scheduler.broken is not None:
            raise RuntimeError(f"the decoding engine is broken: {self.scheduler.broken}")

    async def cluster_health(self) -> dict[str, Any]:
        """The fields this deployment adds to /health (see the module docstring)."""
        from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

        if self.controller is None:
            self.controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
        controller = self.controller
        details = await controller.get_serve_instance_details.remote()
        try:
            served: dict[str, int] | None = await self.board.counts.remote()
        except ray.exceptions.RayActorError:  # the launching process (which owns the board) is gone
            served = None
        app = details.get("applications", {}).get(self.app_name, {})
        state = _name(app.get("status", "UNKNOWN"))
        deployment = app.get("deployments", {}).get(self.deployment, {})
        replicas = [{"id": r["replica_id"], "state": _name(r["state"]),
                     "served": None if served is None else served.get(r["replica_id"], 0),
                     "pid": r.get("pid"), "node": r.get("node_ip")}
                    for r in deployment.get("replicas", [])]
        return {**replica_health(state, [r["state"] for r in replicas], wanted=deployment.get("target_num_replicas")),
                "application": state, "replica": self.id, "replicas": sorted(replicas, key=lambda r: r["id"])}


def replica_health(application: str, replicas: Sequence[str], *, wanted: int | None = None) -> dict[str, Any]:
    """The service's health from Ray Serve's states: the application's and each listed replica's (``wanted``: the
    replicas Ray Serve aims at; unset: those listed).

    "ok" when the application and every replica run, as many as wanted; "degraded" while at least one replica
    runs and another starts, stops or is being replaced (the app answers 200: the service serves); "unavailable"
    when none runs (503). ``replicas_healthy`` counts the running ones."""
    healthy = sum(state == "RUNNING" for state in replicas)
    want = len(replicas) if wanted is None else int(wanted)
    if healthy == 0:
        status = "unavailable"
    elif application == "RUNNING" and healthy == len(replicas) and healthy >= want:
        status = "ok"
    else:
        status = "degraded"
    return {"status": status, "replicas_healthy": healthy, "replicas_wanted": want}


def _name(state: Any) -> str:
    return str(getattr(state, "value", state))  # Ray's str enums, or plain strings


def deployment_options(args: ServeArgs) -> dict[str, Any]:
    """Ray Serve's options for the replicas of ``args`` (fixed ``--replicas``, or autoscaling between
    ``--min_replicas`` and ``--max_replicas`` starting from ``--replicas``)."""
    per_replica = args.max_batch_rows + args.max_queue
    options: dict[str, Any] = dict(
        name=DEPLOYMENT,
        ray_actor_options={"num_cpus": args.replica_cpus, "num_gpus": args.replica_gpus},
        max_ongoing_requests=per_replica + HEALTH_ROOM,
        max_queued_requests=max(1, args.max_queue) * (args.max_replicas or args.replicas or 1),
        graceful_shutdown_timeout_s=args.shutdown_timeout,
        graceful_shutdown_wait_loop_s=0.5,
        health_check_period_s=HEALTH_CHECK_S,
        health_check_timeout_s=30.0,
        # --log_level: the replicas' log level; "info" and "debug" keep Ray Serve's access log, as uvicorn's
        logging_config={"log_level": args.log_level.upper(), "enable_access_log": args.log_level in ("info", "debug")},
    )
    lo, hi = scale_range(args)
    if lo != hi:
        # scale on queue length: one replica per full batch of requests in flight
        options["autoscaling_config"] = {"min_replicas": lo, "max_replicas": hi, "initial_replicas": args.replicas,
                                         "target_ongoing_requests": args.max_batch_rows}
    else:
        options["num_replicas"] = args.replicas
    return options


@dataclass
class Deployed:
    """A running Ray Serve application of `deploy`."""

    name: str
    url: str
    board: Any

    def delete(self) -> None:
        """Delete the application at once (Ray Serve lets its replicas finish what they hold) and its board."""
        serve.delete(self.name)  # (an application already deleted: nothing to do)
        ray.kill(self.board)

    def shutdown(self, timeout: float) -> int:
        """Drain, then delete: new requests get 503 while those in flight have ``timeout`` seconds to finish; the
        rest are then cancelled (503). Returns how many were still in flight at the deadline. Raises
        `ray.exceptions.GetTimeoutError` (or another `RayError`) when the board does not answer within
        ``RAY_CALL_S`` (Ray's processes are gone)."""
        ray.get(self.board.set_phase.remote("draining"), timeout=RAY_CALL_S)
        deadline = time.monotonic() + timeout
        time.sleep(2 * POLL_S)  # every replica has read the phase
        while (left := ray.get(self.board.busy.remote(), timeout=RAY_CALL_S)) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        if left:
            ray.get(self.board.set_phase.remote("cancel"), timeout=RAY_CALL_S)
            time.sleep(4 * POLL_S)
        self.delete()
        return left


def deploy(args: ServeArgs, *, given: Collection[str] = ()) -> Deployed:
    """Deploy ``args``' replicas onto the Ray instance this process is connected to and wait until they serve;
    raises `RuntimeError` when they cannot start (a model that does not load on a node, say)."""
    name = args.model_name or Path(args.checkpoint).resolve().name
    board = ServedBoard.remote()
    serve.start(http_options={"host": args.host, "port": args.port})
    replica = serve.deployment(BiglmReplica).options(**deployment_options(args))
    try:
        serve.run(replica.bind(args, list(given), board), name=name, route_prefix="/")
    except BaseException:
        ray.kill(board)
        raise
    return Deployed(name=name, url=f"http://{args.host}:{args.port}", board=board)


def scale_range(args: ServeArgs) -> tuple[int, int]:
    """The fewest and most replicas (both ``--replicas`` unless --min_replicas/--max_replicas say otherwise)."""
    n = args.replicas or 1
    return (n if args.min_replicas is None else args.min_replicas), (n if args.max_replicas is None
                                                                     else args.max_replicas)


def resources(args: ServeArgs) -> tuple[float, float]:
    """CPUs and GPUs the replicas need at least (their smallest number)."""
    n = scale_range(args)[0]
    return n * args.replica_cpus, n * args.replica_gpus


def main(args: ServeArgs, *, given: Collection[str], prog: str = "biglm serve") -> int:
    """`biglm serve --replicas N`: check, join or start Ray, deploy, serve until Ctrl-C/SIGTERM, then drain.

    Exit status 0 after a shutdown asked for by a signal (at any point: one that arrives while Ray and the replicas
    start stops them once started), 2 when the options, Ray or the replicas do not start.

    Why a thread: everything Ray runs in `_serve` on one thread that lives until Ray is shut down (Ray ties the
    processes it starts to the life of the thread that started them), while the main thread only waits, free to
    take a signal at any moment. Ray's core worker installs a C-level SIGTERM handler that aborts the process; the
    main thread puts its own back as soon as Ray is up (as it did when Ray started on the main thread)."""
    stop, ray_up = threading.Event(), threading.Event()
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in signals}
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(_serve(args, given=given, prog=prog, stop=stop, ray_up=ray_up))
        except BaseException as e:  # noqa: BLE001 - raised again by the main thread
            outcome.append(e)

    runner = threading.Thread(target=run, name="biglm-ray", daemon=True)
    runner.start()
    try:
        while not ray_up.is_set() and runner.is_alive():
            runner.join(0.05)
        for sig in signals:
            signal.signal(sig, lambda *_: stop.set())
        while runner.is_alive():
            runner.join(0.2)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return int(outcome[0])


def _serve(args: ServeArgs, *, given: Collection[str], prog: str, stop: threading.Event,
           ray_up: threading.Event) -> int:
    """`main`'s work, on its Ray thread: start (``ray_up`` set once connected), serve until ``stop`` is set, drain,
    end."""
    # Ray warns that it set no SIGTERM handler off the main thread: the launcher's own handles it (see `main`)
    logging.getLogger("ray._private.worker").addFilter(
        lambda record: "SIGTERM handler is not set" not in record.getMessage())
    try:
        check_model_options(args, given=given)  # the model's config only: no replica starts for a bad option
        cluster = connect(args.ray_address, cpus=resources(args)[0], gpus=resources(args)[1])
    except (ClusterError, FileNotFoundError, OSError, ValueError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    ray_up.set()
    try:
        try:
            deployed = deploy(args, given=given)
        except RuntimeError as e:
            print(f"{prog}: the replicas did not start: {str(e).strip().splitlines()[-1]}", file=sys.stderr)
            return 2
        if not stop.is_set():  # (a signal while starting: straight to the shutdown)
            lo, hi = scale_range(args)
            scale = f"{args.replicas} replicas" + (f", autoscaled in [{lo}, {hi}]" if lo != hi else "")
            print(f"{prog}: {deployed.name} on {deployed.url}/v1 on Ray Serve ({scale}, {args.replica_cpus} CPU "
                  f"{args.replica_gpus:g} GPU each; max_batch_rows={args.max_batch_rows}, max_queue="
                  f"{args.max_queue})", file=sys.stderr, flush=True)
            print(f"{prog}: playground at {playground_url(args.host, args.port)}", file=sys.stderr, flush=True)
            stop.wait()
        print(f"{prog}: shutting down (in-flight requests get {args.shutdown_timeout:g} s)", file=sys.stderr,
              flush=True)
        try:
            left = deployed.shutdown(args.shutdown_timeout)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError) as e:
            print(f"{prog}: Ray stopped answering ({type(e).__name__}; its processes got the signal too?): "
                  "nothing left to drain", file=sys.stderr)
            return 0
        if left:
            print(f"{prog}: cancelled {left} request(s) still running after {args.shutdown_timeout:g} s",
                  file=sys.stderr)
        if cluster.started_here:
            serve.shutdown()
    finally:
        disconnect(cluster)
    return 0
