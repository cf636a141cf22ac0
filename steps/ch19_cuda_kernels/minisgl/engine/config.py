from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class EngineConfig:
    model_path: str
    dtype: torch.dtype = torch.float32
    device: str | None = None  # None: CUDA when present, else the CPU
    max_running_req: int = 256  # rows of the page table: requests that can hold KV at once
    page_size: int = 1  # tokens per KV page
    num_page_override: int | None = None  # None: size the pool from memory
    max_seq_len_override: int | None = None  # None: the model's max_position_embeddings
    memory_ratio: float = 0.9  # CUDA: share of free memory the KV pool may take
    cpu_kv_cache_bytes: int = 1 << 30  # CPU: bytes the KV pool may take
    attention_backend: str = "auto"  # "auto": the fastest backend that runs here
    # Decode as CUDA-graph replays: "auto" on a GPU with a FlashInfer backend, "off", or
    # "emulate" (the CPU's stand-in, same code path); graphs for batches up to cuda_graph_max_bs
    # (None: max_running_req).
    cuda_graph: str = "auto"
    cuda_graph_max_bs: int | None = None
    # Our CUDA kernels (chapter 19): "auto" on a GPU, "off" (the reference ops), or "emulate"
    # (their CPU build, on the CPU: slow, for checking them).
    custom_kernels: str = "auto"
    seed: int = 42
    tp_rank: int = 0  # this process's tensor-parallel rank
    tp_size: int = 1
    # tcp://host:port where the TP ranks meet to form their process group (TP > 1)
    dist_init_address: str | None = None

    def __post_init__(self) -> None:
        for name in ("cuda_graph", "custom_kernels"):
            if (mode := getattr(self, name)) not in ("auto", "off", "emulate"):
                raise ValueError(f"{name} must be auto, off or emulate, got {mode!r}")
        if self.cuda_graph_max_bs is not None and self.cuda_graph_max_bs < 1:
            raise ValueError(f"cuda_graph_max_bs must be >= 1, got {self.cuda_graph_max_bs}")
        for name in ("max_running_req", "page_size", "num_page_override", "max_seq_len_override"):
            value = getattr(self, name)
            if value is not None and value < 1:  # None: the override's default
                raise ValueError(f"{name} must be >= 1, got {value}")
