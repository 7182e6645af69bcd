"""Joining or starting the Ray instance that `ray_serve` and `ray_data` run on.

`connect` is the one place biglm calls ``ray.init``: ``--ray_address HOST:PORT`` joins an existing cluster (its
head's GCS port, as ``ray start --head`` prints), ``auto`` the one this machine belongs to, and no address starts a
local instance for this process (ended with it; never a cluster that ``ray start`` left running, which Ray itself
would join). An address that cannot be reached is a one-line error before any model loads, as is asking a local
instance for more CPUs or GPUs than the machine has.

A local instance outlives a launcher killed with ``kill -9`` in part (Ray's dashboard and runtime-env agents keep
running, orphaned). So a launcher that starts one records its Ray processes (pid and start time) in `SESSIONS`, and
the next launcher on the machine stops the processes of a record whose launcher is gone, before it starts its own.
Only what such a record names is stopped (a process by its pid and start time, or one naming the recorded session
directory on its command line): a cluster the user started, or one of another launcher that still runs, is never
touched.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REACH_TIMEOUT = 5.0  # seconds to wait for a cluster head's port to answer
SESSIONS = Path(tempfile.gettempdir()) / f"biglm-ray-{os.getuid()}"
"""One record (``LAUNCHER_PID.json``) per local Ray instance a biglm launcher started and has not ended."""
STOP_GRACE_S = 3.0  # seconds an orphaned Ray process gets to end on SIGTERM before SIGKILL (the agents ignore it)


class ClusterError(RuntimeError):
    """Ray cannot be joined or started as asked; the message is one line naming the option."""


@dataclass(frozen=True)
class Cluster:
    """The Ray instance this process is connected to."""

    address: str | None
    """as given (None: started here)"""
    started_here: bool
    """this process started it (and `disconnect` ends it)"""
    record: Path | None = None
    """`SESSIONS`' record of the instance started here (removed by `disconnect`)"""


def _reachable(address: str) -> None:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=REACH_TIMEOUT):
            pass
    except OSError as e:
        raise ClusterError(f"--ray_address {address}: no Ray head answers there ({e.strerror or e}); start one with "
                           "`ray start --head` or check the address") from None


def connect(address: str | None, *, cpus: float, gpus: float) -> Cluster:
    """Join the cluster at ``address`` (HOST:PORT or "auto") or start a local instance; ``cpus``/``gpus`` are what
    the job needs at least (checked against a local instance, whose size is this machine's)."""
    import ray

    if address is not None and address != "auto":
        _reachable(address)
    if ray.is_initialized():  # (a test or a notebook that set Ray up itself)
        return Cluster(address=address, started_here=False)
    if address is None:
        have_cpus = os.cpu_count() or 1
        if cpus > have_cpus:
            raise ClusterError(f"the replicas need {cpus:g} CPUs and this machine has {have_cpus}: lower --replicas or "
                               "--replica_cpus, or join a cluster with --ray_address")
        have_gpus = _local_gpus()
        if gpus > have_gpus:
            raise ClusterError(f"the replicas need {gpus:g} GPUs and this machine has {have_gpus}: lower --replicas "
                               "or --replica_gpus, or join a cluster with --ray_address")
        cleaned = stop_orphaned_sessions()
        if cleaned:
            print(f"biglm: stopped {cleaned} Ray process(es) an earlier launcher left running (it was killed)",
                  file=sys.stderr, flush=True)
        # "local": a new instance even where `ray start` left a cluster (plain ray.init() would join that one)
        context = ray.init(address="local", include_dashboard=False, configure_logging=False, log_to_driver=True)
        return Cluster(address=None, started_here=True, record=_record_session(context.address_info["session_dir"]))
    try:
        ray.init(address=address, configure_logging=False, log_to_driver=True)
    except (ConnectionError, RuntimeError) as e:
        raise ClusterError(f"--ray_address {address}: cannot join the Ray cluster ({str(e).splitlines()[0]})") from None
    return Cluster(address=address, started_here=False)


def disconnect(cluster: Cluster) -> None:
    import ray

    if cluster.started_here and ray.is_initialized():
        ray.shutdown()
    if cluster.record is not None:  # what ray.shutdown left behind (an agent that outlived its raylet): stopped
        _stop_session(_read(cluster.record), grace=STOP_GRACE_S)
        cluster.record.unlink(missing_ok=True)


def _psutil() -> Any:
    import ray  # noqa: F401 - Ray bundles psutil (ray/thirdparty_files) and puts it on sys.path when imported
    import psutil

    return psutil


def _same_process(pid: int, started: float) -> Any:
    """The running process ``pid`` if it is the one that started at ``started`` (a pid can be reused), else None."""
    psutil = _psutil()

    try:
        proc = psutil.Process(pid)
        return proc if abs(proc.create_time() - started) < 0.05 and proc.status() != psutil.STATUS_ZOMBIE else None
    except psutil.Error:
        return None


def _record_session(session_dir: str) -> Path | None:
    """Record this launcher and the Ray processes it started for ``session_dir`` (None: it started none)."""
    psutil = _psutil()

    me = psutil.Process()
    processes = []
    for proc in me.children(recursive=True):
        try:
            command = proc.cmdline()
            if any(session_dir in arg for arg in command) or command[:1] and command[0].startswith("ray::"):
                processes.append([proc.pid, proc.create_time()])
        except (psutil.Error, IndexError):
            continue
    if not processes:
        return None
    SESSIONS.mkdir(parents=True, exist_ok=True)
    record = SESSIONS / f"{me.pid}.json"
    record.write_text(json.dumps({"launcher": [me.pid, me.create_time()], "session_dir": session_dir,
                                  "processes": processes}))
    return record


def _read(record: Path) -> dict[str, Any]:
    try:
        data = json.loads(record.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _stop_session(data: dict[str, Any], *, grace: float) -> int:
    """SIGTERM, then after ``grace`` seconds SIGKILL, the live processes of a record; returns how many."""
    psutil = _psutil()

    procs = {}
    for entry in data.get("processes", []):
        proc = _same_process(*entry) if isinstance(entry, list) and len(entry) == 2 else None
        if proc is not None:
            procs[proc.pid] = proc
    session_dir = data.get("session_dir")
    if session_dir:  # a worker started after the record was written names its session on its command line
        for proc in psutil.process_iter(["pid", "cmdline", "uids"]):
            try:
                if (proc.info["uids"] and proc.info["uids"].real == os.getuid() and proc.pid != os.getpid()
                        and any(session_dir in arg for arg in proc.info["cmdline"] or ())):
                    procs[proc.pid] = proc
            except psutil.Error:
                continue
    for proc in procs.values():
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(list(procs.values()), timeout=grace)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace)
    return len(procs)


def stop_orphaned_sessions(*, grace: float = STOP_GRACE_S) -> int:
    """Stop the Ray processes of every `SESSIONS` record whose launcher no longer runs (killed before it could end
    its instance) and remove those records; returns how many processes were stopped."""
    if not SESSIONS.is_dir():
        return 0
    stopped = 0
    for record in sorted(SESSIONS.glob("*.json")):
        data = _read(record)
        launcher = data.get("launcher")
        if isinstance(launcher, list) and len(launcher) == 2 and _same_process(*launcher) is not None:
            continue  # its launcher still runs: the instance is in use
        stopped += _stop_session(data, grace=grace)
        record.unlink(missing_ok=True)
    return stopped


def _local_gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no usable CUDA: no GPUs
        return 0


def replica_device(gpus: float) -> str:
    """Where a replica's model runs: cuda when it reserves a GPU (Ray sets CUDA_VISIBLE_DEVICES to it), else cpu."""
    return "cuda" if gpus > 0 else "cpu"


def limit_threads(cpus: int) -> None:
    """A replica uses the CPUs it reserved, no more (torch would take every core of the node)."""
    import torch

    torch.set_num_threads(max(1, int(cpus)))
