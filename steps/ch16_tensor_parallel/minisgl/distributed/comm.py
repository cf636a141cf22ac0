"""The collectives tensor parallelism needs: no-ops with one rank; torch.distributed with several
(gloo between CPU processes, NCCL between GPUs)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from datetime import timedelta

import torch
import torch.distributed as dist

from .info import TPInfo, set_tp_info


class Communicator(ABC):
    @abstractmethod
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's x, on every rank."""

    @abstractmethod
    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's x, concatenated along the last dimension in rank order."""

    @abstractmethod
    def min_over_ranks(self, value: int) -> int:
        """The smallest of every rank's value: sizes all ranks must agree on (KV pages)."""


class SingleRank(Communicator):
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def min_over_ranks(self, value: int) -> int:
        return value


class TorchDistributed(Communicator):
    """torch.distributed's default group: gloo on the CPU, NCCL on CUDA."""

    def __init__(self, size: int, device: torch.device) -> None:
        self.size, self.device = size, device

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x)  # in place: x is a fresh activation nobody else holds
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)

    def min_over_ranks(self, value: int) -> int:
        t = torch.tensor([value], device=self.device)  # NCCL reduces only device tensors
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())


_comm: Communicator = SingleRank()


def get_comm() -> Communicator:
    return _comm


def init_distributed(info: TPInfo, device: torch.device, init_address: str | None,
                     timeout_s: float = 300.0) -> Communicator:
    """Install this process's TP rank and communicator. One rank without an address needs no
    process group; otherwise every rank must call this with the same address (tcp://host:port),
    and the call returns once all of them have. If it raises, nothing has been installed."""
    global _comm
    if info.size == 1 and init_address is None:
        comm: Communicator = SingleRank()
    elif init_address is None:
        raise ValueError(f"TP size {info.size} needs an init address for the process group")
    else:
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=init_address, rank=info.rank,
                                world_size=info.size, timeout=timedelta(seconds=timeout_s),
                                device_id=device if device.type == "cuda" else None)
        comm = TorchDistributed(info.size, device)
    set_tp_info(info)
    _comm = comm
    return comm


def destroy_distributed() -> None:
    global _comm
    if dist.is_initialized():
        dist.destroy_process_group()
    _comm = SingleRank()
    set_tp_info(TPInfo())
