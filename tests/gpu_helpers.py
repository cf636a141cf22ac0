"""Shared by the GPU test modules (chapters 17 on): the GPU attention backends this GPU runs,
whether a checkpoint's weights are here, and the check that two greedy bfloat16 runs agree up
to near ties."""

from __future__ import annotations

import json
from pathlib import Path

import torch

PROMPTS = ["The capital of France is", "List three colors:", "def fibonacci(n):",
           "The capital of France is a city that"]

# bfloat16 logits of SmolLM2 are off by about 0.1 from float32; a real bug diverges where one
# token leads by far more.
NEAR_TIE = 0.5


def backends() -> list[str]:
    """The GPU attention backends: FA3's prefill kernels need a Hopper GPU."""
    hopper = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
    return ["flashinfer", "fa"] if hopper else ["flashinfer"]


def assert_same_up_to_near_ties(path: Path, prompts: list[str], expected: list[list[int]],
                                got: list[list[int]], label: str) -> None:
    """Greedy tokens equal, except where the two candidates are a near tie: the first
    divergence of each prompt must be at a position where transformers in float32 scores the
    two tokens within NEAR_TIE of each other."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    hf = None
    for prompt, want, have in zip(prompts, expected, got):
        assert len(want) == len(have), (label, prompt)
        first = next((i for i, (a, b) in enumerate(zip(want, have)) if a != b), None)
        if first is None:
            continue
        if hf is None:
            hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda()
        ids = tokenizer(prompt).input_ids + want[:first]
        with torch.no_grad():
            logits = hf(torch.tensor([ids], device="cuda")).logits[0, -1]
        gap = abs(float(logits[want[first]] - logits[have[first]]))
        print(f"\n{label} {prompt!r}: diverges at token {first + 1}, float32 logit gap {gap:.3f}")
        assert gap < NEAR_TIE, (label, prompt, first, gap)


def missing_weights(path: Path) -> str | None:
    """Why the checkpoint at `path` has no weights here, or None. A checkpoint too large to
    carry to a GPU machine may be absent there (its config and tokenizer travel, its weights do
    not), or be a placeholder: an empty file, a Git LFS pointer, a cut-off copy. A safetensors
    file starts with its header's length (8 bytes, little-endian), then the header: JSON."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        return f"{path.name}'s weights are not on this machine"
    for file in files:
        size = file.stat().st_size
        with file.open("rb") as f:
            head = f.read(8)
            length = int.from_bytes(head, "little") if len(head) == 8 else None
            header = f.read(length) if length is not None and 8 + length <= size else b""
        try:
            json.loads(header)
        except ValueError:
            return (f"{path.name}'s {file.name} ({size:,} bytes) is a placeholder, not weights: "
                    "no safetensors header")
    return None


def require_weights(path: Path) -> Path:
    """`path`, or a skip that says why its weights are not here."""
    import pytest

    if reason := missing_weights(path):
        pytest.skip(reason)
    return path


def gpu_model(models_dir: Path) -> Path:
    """A checkpoint FlashInfer runs (head_dim 64 or 128) for tests that need no transformers
    reference: SmolLM2 where its weights are, else the random Qwen3-0.6B-shaped model
    (`tools/models.py --only qwen3-0.6b-random`, built in seconds on a GPU machine)."""
    import pytest

    from conftest import SMOLLM2

    for name in (SMOLLM2, "qwen3-0.6b-random"):
        path = models_dir / name
        if (path / "config.json").is_file() and missing_weights(path) is None:
            return path
    pytest.skip("neither SmolLM2's weights nor models/qwen3-0.6b-random are on this machine")
