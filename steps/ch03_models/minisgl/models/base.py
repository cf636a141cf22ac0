from __future__ import annotations

from abc import abstractmethod

import torch

from minisgl.layers import BaseOP

from .config import ModelConfig


class CausalLM(BaseOP):
    """A model the engine can run: built from a ModelConfig, forward() reads the batch from the
    global Context and returns one row of logits per request."""

    def __init__(self, config: ModelConfig) -> None:
        self.config = config

    @abstractmethod
    def forward(self) -> torch.Tensor: ...
