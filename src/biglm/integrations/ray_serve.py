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
  lists, ``served`` counting the completions and chat requests that replica answered. The counts live in one small
  actor (`ServedBoard`), since a replica can only see its own.
- Faults: a killed replica's requests end as Ray Serve's proxy ends them (a 500, which the `openai` client retries;
  a stream already started is cut); the controller notices the death within ``HEALTH_CHECK_S`` seconds and starts a
  replacement while the others keep serving. A replica whose engine broke fails its health check and is replaced.
- Overload: a replica takes up to ``max_batch_rows + max_queue`` requests (plus a few for /health), refusing more
  with its own 429; requests no replica can take wait in Ray Serve's queue up to ``max_queue`` per replica, then get
  Ray Serve's 503 at once.
- Shutdown (Ctrl-C / SIGTERM), as in one process: the replicas answer new requests 503 while those in flight get
  ``--shutdown_timeout`` seconds to finish, then the rest are cancelled (503) and the application is deleted. The
  launcher tells the replicas through the board, which each polls every ``POLL_S`` seconds.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray import serve

from ..serving.cli import ServeArgs, build_app, check_model_options
from .ray_cluster import Cluster, ClusterError, connect, disconnect, limit_threads, replica_device

DEPLOYMENT = "biglm"
HEALTH_CHECK_S = 2.0  # how often the controller checks each replica (and so notices a dead one)
POLL_S = 0.25  # how often a replica reads the shutdown phase
HEALTH_ROOM = 8  # requests a full replica still takes beyond its queue: /health and the 429s it answers itself
SERVED_PATHS = ("/v1/completions", "/v1/chat/completions")


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
    """ASGI middleware: after a completions or chat request is answered (a stream: to its end), ``on_served()``."""

    def __init__(self, app: Any, on_served: Any) -> None:
        self.app, self.on_served = app, on_served

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)
        if scope["type"] == "http" and scope.get("method") == "POST" and scope.get("path") in SERVED_PATHS:
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
        replicas = [{"id": r["replica_id"], "state": _name(r["state"]),
                     "served": None if served is None else served.get(r["replica_id"], 0),
                     "pid": r.get("pid"), "node": r.get("node_ip")}
                    for r in app.get("deployments", {}).get(self.deployment, {}).get("replicas", [])]
        healthy = state == "RUNNING" and all(r["state"] == "RUNNING" for r in replicas)
        return {"status": "ok" if healthy else "degraded", "application": state, "replica": self.id,
                "replicas": sorted(replicas, key=lambda r: r["id"])}


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
        rest are then cancelled (503). Returns how many were still in flight at the deadline."""
        ray.get(self.board.set_phase.remote("draining"))
        deadline = time.monotonic() + timeout
        time.sleep(2 * POLL_S)  # every replica has read the phase
        while (left := ray.get(self.board.busy.remote())) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        if left:
            ray.get(self.board.set_phase.remote("cancel"))
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
    """`biglm serve --replicas N`: check, join or start Ray, deploy, serve until Ctrl-C/SIGTERM, then drain."""
    try:
        check_model_options(args, given=given)  # the model's config only: no replica starts for a bad option
        cluster = connect(args.ray_address, cpus=resources(args)[0], gpus=resources(args)[1])
    except (ClusterError, FileNotFoundError, OSError, ValueError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    try:
        try:
            deployed = deploy(args, given=given)
        except RuntimeError as e:
            print(f"{prog}: the replicas did not start: {str(e).strip().splitlines()[-1]}", file=sys.stderr)
            return 2
        lo, hi = scale_range(args)
        scale = f"{args.replicas} replicas" + (f", autoscaled in [{lo}, {hi}]" if lo != hi else "")
        print(f"{prog}: {deployed.name} on {deployed.url}/v1 on Ray Serve ({scale}, {args.replica_cpus} CPU "
              f"{args.replica_gpus:g} GPU each; max_batch_rows={args.max_batch_rows}, max_queue={args.max_queue})",
              file=sys.stderr, flush=True)
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        stop.wait()
        print(f"{prog}: shutting down (in-flight requests get {args.shutdown_timeout:g} s)", file=sys.stderr,
              flush=True)
        left = deployed.shutdown(args.shutdown_timeout)
        if left:
            print(f"{prog}: cancelled {left} request(s) still running after {args.shutdown_timeout:g} s",
                  file=sys.stderr)
        if cluster.started_here:
            serve.shutdown()
    finally:
        disconnect(cluster)
    return 0
