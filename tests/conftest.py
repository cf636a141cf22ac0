"""Shared fixtures for the stage-1 tests: checkpoint paths, session-scoped models (ours and
transformers'), and transformers' greedy generation as the reference."""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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

    @functools.cache
    def get(name: str) -> torch.nn.Module:
        return AutoModelForCausalLM.from_pretrained(MODELS_DIR / name, dtype=torch.float32).eval()

    return get


@pytest.fixture(scope="session")
def our_model():
    """our_model(name) -> minisgl's model for models/<name> (float32, CPU), loaded once."""
    from minisgl.models import load_model

    @functools.cache
    def get(name: str):
        return load_model(MODELS_DIR / name, dtype=torch.float32, device="cpu")

    return get


@pytest.fixture(scope="session")
def hf_tokenizer():
    """hf_tokenizer(name) -> transformers' tokenizer for models/<name>, loaded once a session."""
    from transformers import AutoTokenizer

    @functools.cache
    def get(name: str):
        return AutoTokenizer.from_pretrained(MODELS_DIR / name)

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


@pytest.fixture
def model_copy(tmp_path) -> Callable[..., Path]:
    """model_copy(name, change=None) -> a copy of models/<name> in tmp_path (config.json and
    model.safetensors) whose tensors `change(state)` has rewritten, when given."""
    from safetensors.torch import load_file, save_file

    def copy(name: str, change: Callable[[dict[str, torch.Tensor]], object] | None = None) -> Path:
        src, dst = MODELS_DIR / name, tmp_path / name
        dst.mkdir(exist_ok=True)
        shutil.copy(src / "config.json", dst / "config.json")
        if change is None:
            shutil.copy(src / "model.safetensors", dst / "model.safetensors")
        else:
            state = load_file(src / "model.safetensors")
            change(state)
            save_file(state, dst / "model.safetensors")
        return dst

    return copy


EXAMPLE_PROMPT = "The capital of France is"  # the prompt of the chapters' examples


@pytest.fixture(scope="session")
def hf_example_text(hf_model, hf_tokenizer) -> Callable[[str, int], str]:
    """hf_example_text(name, n) -> the text of the n tokens transformers' greedy generate
    appends to EXAMPLE_PROMPT with models/<name> (as hf_greedy): what an example prints."""

    def text(name: str, n: int) -> str:
        tokenizer = hf_tokenizer(name)
        return tokenizer.decode(_hf_greedy(hf_model(name), tokenizer(EXAMPLE_PROMPT).input_ids, n))

    return text


def load_error(path: Path, error: type[Exception] = ValueError) -> str:
    """The message of the `error` that load_model(path) raises (chapter 3 on)."""
    from minisgl.models import load_model

    with pytest.raises(error) as info:
        load_model(path)
    return str(info.value)


@contextmanager
def as_tp_rank(rank: int, size: int) -> Iterator[None]:
    """This process is rank `rank` of `size` tensor-parallel ranks inside the block, alone again
    after it (chapter 16 on): what sharded loading and layers read, without a process group."""
    from minisgl.distributed import TPInfo, set_tp_info

    set_tp_info(TPInfo(rank, size))
    try:
        yield
    finally:
        set_tp_info(TPInfo())


def load_as(path: Path, rank: int, size: int):
    """The model at `path` as rank `rank` of `size` loads it: its own shards (chapter 16 on)."""
    from minisgl.models import load_model

    with as_tp_rank(rank, size):
        return load_model(path)
