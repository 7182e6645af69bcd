"""Joining or starting the Ray instance that `ray_serve` and `ray_data` run on.

`connect` is the one place biglm calls ``ray.init``: ``--ray_address HOST:PORT`` joins an existing cluster (its
head's GCS port, as ``ray start --head`` prints), ``auto`` the one this machine belongs to, and no address starts a
local instance for this process (ended with it). An address that cannot be reached is a one-line error before any
model loads, as is asking a local instance for more CPUs or GPUs than the machine has.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

REACH_TIMEOUT = 5.0  # seconds to wait for a cluster head's port to answer


class ClusterError(RuntimeError):
    """Ray cannot be joined or started as asked; the message is one line naming the option."""


@dataclass(frozen=True)
class Cluster:
    """The Ray instance this process is connected to."""

    address: str | None
    """as given (None: started here)"""
    started_here: bool
    """this process started it (and `disconnect` ends it)"""


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
        ray.init(include_dashboard=False, configure_logging=False, log_to_driver=True)
        return Cluster(address=None, started_here=True)
    try:
        ray.init(address=address, configure_logging=False, log_to_driver=True)
    except (ConnectionError, RuntimeError) as e:
        raise ClusterError(f"--ray_address {address}: cannot join the Ray cluster ({str(e).splitlines()[0]})") from None
    return Cluster(address=address, started_here=False)


def disconnect(cluster: Cluster) -> None:
    import ray

    if cluster.started_here and ray.is_initialized():
        ray.shutdown()


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
