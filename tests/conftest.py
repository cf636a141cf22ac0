"""Shared fixtures for the stage-1 tests: checkpoint paths, session-scoped models (ours and
transformers'), and transformers' greedy generation as the reference."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

# Under pytest-xdist (make test) several workers share the CPUs, and so do the servers, ranks
# and examples they start. A waiting OpenMP thread spins on its core by default; with more
# threads than cores the spinning ones take the cores from those with work, and every parallel
# region waits for a thread that is not running: two of chapter 18's test runs side by side on
# 2 cores took 233 s each, 32-43 s alone (6x, not 2x). So waiting threads sleep instead (children
# inherit it). libgomp reads the policy once, when torch loads it: before the import below.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

# Chapter 20: without CUDA, Triton kernels run only in Triton's interpreter, and Triton makes
# that choice once, when triton.language is first imported -- by whichever module imports it
# first (transformers may). So a CPU test session turns the interpreter on before anything runs.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Under pytest-xdist (make test) several workers share the CPUs: each one's own torch work (the
# in-process models, most of the suite) gets its share of threads, so that N workers do not run
# N x cores threads. Not through OMP_NUM_THREADS: engines and servers the tests start choose
# their threads as they would alone, and tests check that choice.
if (workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))) > 1:
    torch.set_num_threads(max(1, torch.get_num_threads() // workers))

ROOT = Path(__file__).resolve().parent.parent  # the repository, or a tree built by tools/steps.py
MODELS_DIR = Path(os.environ.get("MINISGL_MODELS") or ROOT / "models")
SMOLLM2 = "SmolLM2-135M-Instruct"
TINY_QWEN3 = "tiny-qwen3"
TINY_LLAMA = "tiny-llama"
TINY_QWEN2 = "tiny-qwen2"  # q/k/v biases
TINY_MISTRAL = "tiny-mistral"
TINY_QWEN3_MOE = "tiny-qwen3-moe"  # 8 experts, top-2; layer 1 of 4 dense (chapter 20)


@pytest.fixture(autouse=True)
def _deterministic_no_grad():
    """Every test starts from the same RNG state and builds no autograd graph."""
    torch.manual_seed(0)
    with torch.no_grad():
        yield


def sysfs_physical_cores() -> int | None:
    """Physical cores as sysfs lists them: distinct (package, core) pairs of the CPUs' topology.
    A source utils.device does not read (it parses /proc/cpuinfo). None without sysfs."""
    cores = set()
    for topology in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/topology"):
        try:
            cores.add(((topology / "physical_package_id").read_text().strip(),
                       (topology / "core_id").read_text().strip()))
        except OSError:
            return None
    return len(cores) or None


def reference_cpu_threads(tp_size: int = 1) -> int | None:
    """The thread count the engine should pick here, found without utils.device: physical
    cores (sysfs), capped by the CPUs this process may use (affinity mask, cgroup v2 quota),
    split among TP ranks. None where sysfs has no topology."""
    cores = sysfs_physical_cores()
    if cores is None or not hasattr(os, "sched_getaffinity"):
        return None
    usable = len(os.sched_getaffinity(0))
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            usable = min(usable, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return max(1, min(cores, usable) // tp_size)


@pytest.fixture(scope="session")
def models_dir() -> Path:
    return MODELS_DIR


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return MODELS_DIR / SMOLLM2


@pytest.fixture(scope="session")
def tiny_qwen3_path() -> Path:
    return MODELS_DIR / TINY_QWEN3


@pytest.fixture(scope="session")
def tiny_llama_path() -> Path:
    return MODELS_DIR / TINY_LLAMA


@pytest.fixture(scope="session")
def hf_model() -> Callable[[str], torch.nn.Module]:
    """hf_model(name) -> transformers' float32 model for models/<name>, loaded once a session."""
    from transformers import AutoModelForCausalLM

    cache: dict[str, torch.nn.Module] = {}

    def get(name: str) -> torch.nn.Module:
        if name not in cache:
            model = AutoModelForCausalLM.from_pretrained(MODELS_DIR / name, dtype=torch.float32)
            cache[name] = model.eval()
        return cache[name]

    return get


@pytest.fixture(scope="session")
def our_model():
    """our_model(name) -> minisgl's model for models/<name> (float32, CPU), loaded once."""
    from minisgl.models import load_model

    cache: dict = {}

    def get(name: str):
        if name not in cache:
            cache[name] = load_model(MODELS_DIR / name, dtype=torch.float32, device="cpu")
        return cache[name]

    return get


@pytest.fixture(scope="session")
def hf_tokenizer():
    from transformers import AutoTokenizer

    cache: dict = {}

    def get(name: str):
        if name not in cache:
            cache[name] = AutoTokenizer.from_pretrained(MODELS_DIR / name)
        return cache[name]

    return get


def _hf_greedy(hf: torch.nn.Module, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                          eos_token_id=None, do_sample=False)
    return out[0, len(prompt_ids):].tolist()


def greedy_by_tp(path: Path, prompts: list[list[int]], params, options: dict,
                 tp_sizes: tuple[int, ...] = (1, 2)) -> dict[int, list[list[int]]]:
    """Our float32 greedy tokens for every prompt at each tensor-parallel size: one generate
    over all the prompts (a batch of several requests), one LLM at a time."""
    from minisgl.llm import LLM  # chapter 11 on; conftest is in every chapter's tree

    tokens = {}
    for tp in tp_sizes:
        llm = LLM(str(path), dtype=torch.float32, tp_size=tp, **options)
        try:
            tokens[tp] = [o["token_ids"] for o in llm.generate(prompts, params)]
        finally:
            llm.shutdown()
    return tokens


@pytest.fixture(scope="session")
def hf_greedy() -> Callable[[torch.nn.Module, list[int], int], list[int]]:
    """hf_greedy(hf, prompt_ids, n) -> the n tokens transformers' greedy generate appends,
    for this prompt alone (no padding, EOS not allowed to stop it early)."""
    return _hf_greedy
