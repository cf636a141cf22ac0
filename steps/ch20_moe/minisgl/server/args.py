"""The command line of `python -m minisgl`, turned into the configuration of every process."""

from __future__ import annotations

import argparse
import errno
import socket
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minisgl.scheduler import SchedulerConfig

# The names --dtype, --cache-type, --attn and --moe take, written out rather than read from torch
# and the registries: --help, --version and a mistyped flag answer before torch and the backends are
# imported, which takes seconds (tests/test_cli.py checks them against the registries' names).
DTYPES = ("float32", "bfloat16", "float16")
PREFIX_CACHE_NAMES = ("naive", "radix")
ATTENTION_BACKEND_NAMES = ("fa", "flashinfer", "torch")
MOE_BACKEND_NAMES = ("torch", "triton")


@dataclass(frozen=True)
class ServerArgs:
    scheduler: SchedulerConfig
    host: str = "127.0.0.1"
    port: int = 1919
    num_tokenizer: int = 0  # 0: one process tokenizes and detokenizes
    model_name: str = ""  # the name /v1/models reports: the model directory's name
    shell: bool = False


def package_version() -> str:
    try:
        return version("minisgl")
    except PackageNotFoundError:  # a source tree that pip never installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m minisgl",
        description="Serve a model with an OpenAI-compatible API (or chat with it: --shell).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    p.add_argument("--model", "--model-path", dest="model", required=True,
                   help="directory of a Hugging Face checkpoint (config.json, safetensors, "
                        "tokenizer)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=1919,
                   help="port to listen on (0: any free one, named in the ready line)")
    p.add_argument("--shell", action="store_true",
                   help="chat in this terminal instead of serving HTTP")
    p.add_argument("--tp", "--tp-size", dest="tp", type=int, default=1,
                   help="tensor-parallel ranks: one scheduler process (and one GPU) each")
    p.add_argument("--num-tokenizer", type=int, default=0,
                   help="tokenizer processes; 0 lets the detokenizer process tokenize too")
    p.add_argument("--dtype", choices=["auto", *DTYPES], default="auto",
                   help="weights and activations; auto is bfloat16 on CUDA, float32 on the CPU")
    p.add_argument("--device", default=None,
                   help="cuda, cuda:N or cpu (default: CUDA when present, else the CPU)")
    p.add_argument("--cache-type", choices=PREFIX_CACHE_NAMES, default="radix",
                   help="prefix cache: radix shares prompt prefixes, naive shares nothing")
    p.add_argument("--attention-backend", "--attn", choices=["auto", *ATTENTION_BACKEND_NAMES],
                   default="auto",
                   help="attention kernels; auto: the fastest that runs here (torch on the CPU)")
    p.add_argument("--moe", "--moe-backend", dest="moe_backend",
                   choices=["auto", *MOE_BACKEND_NAMES], default="auto",
                   help="mixture-of-experts kernels; auto: the fastest that runs here")
    p.add_argument("--page-size", type=int, default=1, help="tokens per KV page")
    p.add_argument("--max-running-req", type=int, default=256,
                   help="requests that can run at once (rows of the page table)")
    p.add_argument("--num-pages", type=int, default=None,
                   help="KV pages in the pool (default: sized from memory)")
    p.add_argument("--max-seq-len", type=int, default=None,
                   help="longest prompt + completion (default: the model's limit)")
    p.add_argument("--max-prefill-length", type=int, default=8192,
                   help="prompt tokens one prefill batch computes; longer prompts are chunked")
    p.add_argument("--memory-ratio", type=float, default=0.9,
                   help="CUDA: share of free memory the KV pool may take")
    p.add_argument("--cpu-kv-cache-gb", type=float, default=1.0,
                   help="CPU: gigabytes the KV pool may take")
    p.add_argument("--disable-cuda-graph", action="store_true",
                   help="decode eagerly instead of replaying CUDA graphs")
    p.add_argument("--disable-custom-kernels", action="store_true",
                   help="on a GPU, run the reference ops instead of our CUDA kernels")
    p.add_argument("--cuda-graph-max-bs", type=int, default=None,
                   help="capture decode graphs up to this batch size (default: "
                        "--max-running-req); larger batches run eagerly")
    p.add_argument("--disable-overlap", action="store_true",
                   help="no overlap scheduling: prepare each step after the previous one ended")
    p.add_argument("--seed", type=int, default=42, help="random seed for sampling")
    return p


def _cannot_listen(host: str, port: int) -> str | None:
    """Why the server could not listen on host:port (None: it can), found by binding there."""
    try:  # the socket's family follows the host: "::" needs an IPv6 socket
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        return f"--host {host}: {e.strerror}"
    try:
        with socket.socket(family, kind, proto) as s:
            # As uvicorn binds: a port left in TIME_WAIT by a server just stopped is free.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(address)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            return f"port {port} on {host} is in use; choose another with --port"
        return f"cannot listen on {host} port {port}: {e.strerror}"
    return None


def check_command_line(argv: list[str]) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The checks that need neither torch nor the model's code. `python -m minisgl` runs them
    before it imports the server, so --help, --version and these mistakes answer at once."""
    parser = build_parser()
    a = parser.parse_args(argv)
    model = Path(a.model)
    if not (model / "config.json").is_file():
        parser.error(f"--model {a.model}: no config.json there; it must be a Hugging Face "
                     "checkpoint directory")
    if a.tp < 1:
        parser.error(f"--tp must be >= 1, got {a.tp}")
    if a.num_tokenizer < 0:
        parser.error(f"--num-tokenizer must be >= 0, got {a.num_tokenizer}")
    if not 0 <= a.port <= 65535:
        parser.error(f"--port must be between 0 and 65535, got {a.port}")
    if not a.shell and (problem := _cannot_listen(a.host, a.port)):
        parser.error(problem)
    return parser, a


def parse_args(argv: list[str]) -> ServerArgs:
    """Parsed and checked before any process starts: a mistake costs no model loading."""
    parser, a = check_command_line(argv)
    import torch  # imported only now (seconds): the checks above answer without it

    from minisgl.attention import resolve_attention_backend
    from minisgl.models import ModelConfig, check_tensor_parallel
    from minisgl.moe import resolve_moe_backend
    from minisgl.scheduler import SchedulerConfig
    from minisgl.utils import pick_device

    model = Path(a.model)
    try:
        device = pick_device(a.device)
        auto = torch.bfloat16 if device.type == "cuda" else torch.float32
        dtype = auto if a.dtype == "auto" else getattr(torch, a.dtype)
        scheduler = SchedulerConfig(
            model_path=str(model), dtype=dtype, device=str(device),
            max_running_req=a.max_running_req, page_size=a.page_size,
            num_page_override=a.num_pages, max_seq_len_override=a.max_seq_len,
            memory_ratio=a.memory_ratio, cpu_kv_cache_bytes=int(a.cpu_kv_cache_gb * (1 << 30)),
            attention_backend=a.attention_backend, seed=a.seed, cache_type=a.cache_type,
            max_prefill_length=a.max_prefill_length, overlap=not a.disable_overlap,
            cuda_graph="off" if a.disable_cuda_graph else "auto",
            cuda_graph_max_bs=a.cuda_graph_max_bs,
            custom_kernels="off" if a.disable_custom_kernels else "auto",
            moe_backend=a.moe_backend,
            tp_size=a.tp)
        check_tensor_parallel(model, a.tp)
        checkpoint = ModelConfig.from_dir(model)
        resolve_attention_backend(a.attention_backend, device, dtype, checkpoint.head_dim)
        if checkpoint.num_experts:
            resolve_moe_backend(a.moe_backend, device, dtype)
    except ValueError as e:
        parser.error(str(e))
    return ServerArgs(scheduler, a.host, a.port, a.num_tokenizer, model.resolve().name, a.shell)
