"""The few CUDA-only objects the engine uses, with no-op stand-ins on the CPU: one code path for
both. MPS is never chosen: float32 results must match transformers token for token."""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext

import torch


def pick_device(requested: str | None = None) -> torch.device:
    """`requested` if given, else the first CUDA device when there is one, else the CPU."""
    if requested is not None:
        device = torch.device(requested)
        if device.type not in ("cuda", "cpu"):
            raise ValueError(f"device {requested!r} is not supported; use 'cuda' or 'cpu'")
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {requested!r} was requested but CUDA is not available")
        return device
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


class NullEvent:
    """torch.cuda.Event's interface where work is synchronous: always already complete."""

    def record(self, stream: object = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class NullStream:
    """torch.cuda.Stream's interface on the CPU, where every op runs in issue order anyway."""

    def wait_stream(self, stream: object) -> None:
        pass


Stream = torch.cuda.Stream | NullStream
Event = torch.cuda.Event | NullEvent


def create_stream(device: torch.device) -> Stream:
    return torch.cuda.Stream(device) if device.type == "cuda" else NullStream()


def create_event(device: torch.device) -> Event:
    return torch.cuda.Event() if device.type == "cuda" else NullEvent()


def current_stream(device: torch.device) -> Stream:
    """The stream work on `device` is issued to now; a NullStream on the CPU."""
    return torch.cuda.current_stream(device) if device.type == "cuda" else NullStream()


def synchronize(device: torch.device) -> None:
    """Wait until every stream of `device` has done its work; the CPU has nothing to wait for."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def use_stream(stream: Stream) -> AbstractContextManager[object]:
    """`with use_stream(s):` makes s the current CUDA stream; nothing on the CPU."""
    return torch.cuda.stream(stream) if isinstance(stream, torch.cuda.Stream) else nullcontext()


def pin(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Page-locked host memory makes device<->host copies asynchronous; pinning needs CUDA."""
    return tensor.pin_memory() if device.type == "cuda" else tensor


def physical_core_count() -> int:
    """Distinct (socket, core) pairs in /proc/cpuinfo; logical CPUs where that is unavailable."""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return os.cpu_count() or 1
    cores, socket = set(), "0"
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "physical id":
            socket = value.strip()
        elif key.strip() == "core id":
            cores.add((socket, value.strip()))
    return len(cores) or os.cpu_count() or 1


def usable_cpu_count() -> int:
    """CPUs this process may actually run on: its affinity mask, capped by a cgroup v2 CPU
    quota. A container often sees every core of its host in /proc/cpuinfo but gets a few."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()
        if quota != "max":
            usable = min(usable or 1, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return usable or 1


def configure_threads(device: torch.device, tp_size: int = 1) -> int:
    """PyTorch's threads for a process whose model runs on `device`, unless OMP_NUM_THREADS says
    otherwise; returns the count in effect. On the CPU, one per physical core this process may
    use, split among TP ranks: for decode's tiny matrices, more threads mostly add
    synchronisation. With a GPU, one: the host builds only small tensors, and idle OpenMP
    workers spinning after each op slow every step on a many-core host."""
    if "OMP_NUM_THREADS" not in os.environ:
        cores = min(physical_core_count(), usable_cpu_count()) // tp_size
        torch.set_num_threads(max(1, cores) if device.type == "cpu" else 1)
    return torch.get_num_threads()
