from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from minisgl.engine import EngineConfig


@dataclass(frozen=True)
class SchedulerConfig(EngineConfig):
    """The engine's configuration plus what only scheduling needs."""

    cache_type: str = "radix"  # prefix cache: "radix" shares prefixes, "naive" shares nothing
    max_prefill_length: int = 8192  # prompt tokens one prefill batch may compute; longer: chunks
    # Prepare step i+1 while step i computes; MINISGL_DISABLE_OVERLAP_SCHEDULING=1 turns it off.
    overlap: bool = field(
        default_factory=lambda: os.environ.get("MINISGL_DISABLE_OVERLAP_SCHEDULING", "0") != "1")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_prefill_length < 1:
            raise ValueError(f"max_prefill_length must be >= 1, got {self.max_prefill_length}")


def read_eos_token_ids(model_path: str) -> frozenset[int]:
    """The tokens that end a generation: generation_config.json's eos_token_id (an int or a
    list), else config.json's."""
    for name in ("generation_config.json", "config.json"):
        path = Path(model_path) / name
        if path.is_file():
            eos = json.loads(path.read_text()).get("eos_token_id")
            if eos is not None:
                return frozenset(eos if isinstance(eos, list) else [eos])
    return frozenset()
