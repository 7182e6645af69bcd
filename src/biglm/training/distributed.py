"""Process groups and `parallelize`: everything about many devices lives here, not in the model.

`parallelize(model, ...)` applies, in order: activation checkpointing (per block), torch.compile
(per block), then data parallelism — FSDP2 (`fully_shard` per block, then the root, with a
bf16/fp32 mixed-precision policy) or DDP. The same code runs on CPU with the gloo backend, which
is how CI runs a real 2-process `torchrun`.
"""

from __future__ import annotations

import datetime
import os
import typing
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def init_distributed(device: str = "auto") -> DistInfo:
    """Read torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK), pick the device and start the
    process group (nccl on GPU, gloo on CPU) when there is more than one process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda was asked for but no CUDA GPU is visible; use --device cpu.")
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    else:
        dev = torch.device("cpu")
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(minutes=30),
                                device_id=dev if dev.type == "cuda" else None)
    return DistInfo(rank=rank, world_size=world, local_rank=local, device=dev)


def destroy_distributed() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum over ranks in place (no-op in a single process); stays on device, no host sync."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def host_group() -> "dist.ProcessGroup | None":
    """A process group for small host-side agreements (a stop signal, say) that touch no device and so add no GPU
    sync: the default group when it is gloo, else a new gloo group (collective: every rank calls it, at the same
    point). None in a single process."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    if dist.get_backend() == "gloo":
        return dist.group.WORLD
    return dist.new_group(backend="gloo")


def agree_max(value: int, *, group: "dist.ProcessGroup | None") -> int:
    """The largest of every rank's ``value`` (a CPU collective over `host_group`'s group); ``value`` itself in one
    process."""
    if group is None:
        return value
    t = torch.tensor([value], dtype=torch.long)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return int(t.item())


def parallelize(model: nn.Module, *, info: DistInfo, mode: str = "auto", compile: bool = False,
                activation_checkpointing: bool = False, param_dtype: torch.dtype | None = None) -> nn.Module:
    """Prepare a single-device BiGLM for training on ``info``'s device(s).

    Args:
        mode: "ddp", "fsdp" or "auto" (FSDP2 on GPU with several ranks, DDP otherwise).
        compile: torch.compile each transformer block (regional compilation keeps compile time flat in depth).
        activation_checkpointing: recompute each block in the backward pass (saves activation memory); with
            dropout the RNG state is replayed, so the recomputed dropout masks (and the gradients) are exact.
        param_dtype: FSDP2 mixed precision compute dtype (e.g. bf16; gradients reduced in fp32).
    """
    blocks = model.model.layers
    if activation_checkpointing:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        # with dropout, the recomputation must draw the forward's dropout masks again, or the gradients are
        # wrong: replay the RNG state then (without dropout nothing random runs, so skip the state copies)
        config = getattr(model, "config", None)
        dropout = config is None or config.hidden_dropout > 0 or config.attention_dropout > 0
        for i, block in enumerate(blocks):
            blocks[i] = checkpoint_wrapper(block, preserve_rng_state=dropout)
    if compile:
        for block in blocks:
            block.compile()  # in place: parameter names (and so checkpoints) are unchanged
    if not info.distributed:
        return model
    if mode == "auto":
        mode = "fsdp" if info.device.type == "cuda" else "ddp"
    if mode == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) if param_dtype else MixedPrecisionPolicy()
        for block in blocks:
            fully_shard(block, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        return model
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [info.device.index] if info.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)
    raise ValueError(f"parallel={mode!r}: choose ddp, fsdp or auto.")


def is_fsdp(model: nn.Module) -> bool:
    """True when ``model`` was sharded by `parallelize(mode="fsdp")` (FSDP2's ``fully_shard``)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def set_gradient_sync(model: nn.Module, sync: bool):
    """A context for one micro-batch: gradients are reduced over ranks only when ``sync`` (the last
    micro-batch of a step). DDP's ``no_sync``, FSDP2's ``set_requires_gradient_sync``, nothing otherwise."""
    import contextlib

    if not sync and hasattr(model, "no_sync"):
        return model.no_sync()
    if is_fsdp(model):
        model.set_requires_gradient_sync(sync)
    return contextlib.nullcontext()


def shape_template(model: nn.Module) -> nn.Module:
    """A copy of an unsharded model whose parameters live on the meta device (no memory), buffers kept: the
    skeleton `unsharded_copy` fills. Take it before `parallelize` shards the model."""
    import copy

    template = copy.deepcopy(model)
    for module in template.modules():
        for name, param in list(module._parameters.items()):
            if param is not None:
                module._parameters[name] = nn.Parameter(torch.empty_like(param, device="meta"),
                                                        requires_grad=param.requires_grad)
    return template


def unsharded_copy(model: nn.Module, *, template: nn.Module, device: torch.device) -> nn.Module:
    """A plain (unsharded, fp32) copy of a sharded model on every rank, for evaluation and export.

    Collective: every rank must call it. The full state dict is all-gathered (`get_model_state_dict` with
    ``full_state_dict``) and assigned into a copy of ``template`` (`shape_template`); tied weights are tied again.
    For a model that is not sharded, returns ``model`` itself.
    """
    import copy

    if not is_fsdp(model):
        return model
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    plain = copy.deepcopy(template)
    plain.load_state_dict(state, assign=True)
    if hasattr(plain, "tie_weights"):
        plain.tie_weights()
    return plain.to(device)


def full_model_on_rank0(model: nn.Module, raw_model: nn.Module, *, fsdp: bool, is_main: bool,
                        build: "typing.Callable[[], nn.Module]") -> nn.Module | None:
    """The unwrapped model to score on rank 0 (None on other ranks). DDP and one process: the local module
    itself (its weights are complete). FSDP: a full state dict gathered by every rank (a collective), loaded
    into a fresh module from ``build()`` on rank 0."""
    if not fsdp:
        return raw_model if is_main else None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not is_main:
        return None
    fresh = build()
    fresh.load_state_dict(state)
    return fresh
