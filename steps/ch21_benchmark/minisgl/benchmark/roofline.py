"""The roofline cost model: the bytes one forward step must at least move (weights, the
embedding rows of its tokens, K/V read and written) and the FLOPs it must compute, so that no
step takes less than max(bytes / bandwidth, FLOPs / peak). benchmark/roofline.py sets these
bounds next to measured steps.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from minisgl.models import MODELS, ModelConfig

H200_HBM_BANDWIDTH = 4.8e12  # bytes/s: HBM3e, NVIDIA's H200 datasheet
# bytes/s (read + written) a device-to-device copy reaches on an H200, about 84% of the spec
# (chapter 21): a tighter bound, as a kernel that streams its bytes once moves them no faster
# than a copy.
H200_COPY_BANDWIDTH = 4.0e12
H200_BF16_PEAK = 989e12  # FLOP/s: dense bf16 tensor cores, H200 SXM datasheet
DECODE_BUCKETS = (1, 8, 32, 64, 128, 256)  # upper ends of the decode batch-size buckets


@dataclass(frozen=True)
class ModelShape:
    """What the cost of a dense Llama-style decoder depends on (biases, a few KB, left out)."""

    layers: int
    hidden: int
    intermediate: int
    q_heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool  # the LM head reuses the embedding table
    qk_norm: bool  # Qwen3: an RMSNorm on every head of q and k

    @classmethod
    def of(cls, config: ModelConfig) -> ModelShape:
        if config.num_experts:
            raise ValueError(f"{config.architecture} has experts; this cost model is for dense "
                             f"models only")
        return cls(config.num_layers, config.hidden_size, config.intermediate_size,
                   config.num_q_heads, config.num_kv_heads, config.head_dim, config.vocab_size,
                   config.tie_word_embeddings, MODELS.get(config.architecture).qk_norm)

    @property
    def linear_params_per_layer(self) -> int:
        q, kv = self.q_heads * self.head_dim, self.kv_heads * self.head_dim
        attention = self.hidden * (q + 2 * kv) + q * self.hidden  # qkv_proj, o_proj
        return attention + 3 * self.hidden * self.intermediate  # gate, up, down

    @property
    def norm_params_per_layer(self) -> int:
        return 2 * self.hidden + 2 * self.head_dim * self.qk_norm

    @property
    def parameters(self) -> int:
        """As the checkpoint holds them: a tied table counts once."""
        return self.weights_read_per_step + self.vocab * self.hidden * (not self.tied)

    @property
    def weights_read_per_step(self) -> int:
        """Every layer, the final norm and the LM head; of the embedding (when it is a table of
        its own) a step reads only the rows of its tokens, counted per token."""
        per_layer = self.linear_params_per_layer + self.norm_params_per_layer
        return self.layers * per_layer + self.hidden + self.vocab * self.hidden

    @property
    def kv_per_token(self) -> int:
        """Elements of K and V one token keeps in the cache, all layers."""
        return self.layers * 2 * self.kv_heads * self.head_dim


@dataclass(frozen=True)
class StepShape:
    """What one forward computes, summed over its requests."""

    phase: str  # "prefill" or "decode"
    # = the rows the LM head scores: each request's last new token (a prompt chunk's too,
    # whose sampled token is then dropped)
    requests: int
    new_tokens: int
    cached_tokens: int  # tokens whose K/V the step reads from the cache
    attention_pairs: int  # (query, key) pairs, causal among the new tokens

    @classmethod
    def of(cls, phase: str, lengths: Iterable[tuple[int, int]]) -> StepShape:
        """From each request's (cached_len, device_len): it computes tokens cached_len..
        device_len-1, and new token i (1-based) attends to cached_len + i keys."""
        spans = [(cached, total - cached) for cached, total in lengths]  # (cached, new)
        return cls(phase, len(spans), sum(new for _, new in spans), sum(c for c, _ in spans),
                   sum(new * cached + new * (new + 1) // 2 for cached, new in spans))


@dataclass(frozen=True)
class Hardware:
    bandwidth: float  # bytes/s
    peak_flops: float  # FLOP/s


H200 = Hardware(H200_HBM_BANDWIDTH, H200_BF16_PEAK)


@dataclass(frozen=True)
class Cost:
    weight_bytes: int
    kv_bytes: int
    flops: int

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes

    def memory_seconds(self, hw: Hardware) -> float:
        return self.bytes / hw.bandwidth

    def compute_seconds(self, hw: Hardware) -> float:
        return self.flops / hw.peak_flops

    def bound(self, hw: Hardware) -> float:
        return max(self.memory_seconds(hw), self.compute_seconds(hw))

    def memory_bound(self, hw: Hardware) -> bool:
        return self.memory_seconds(hw) >= self.compute_seconds(hw)


def step_cost(model: ModelShape, step: StepShape, dtype_bytes: int) -> Cost:
    embedding_rows = step.new_tokens * model.hidden
    kv = (step.cached_tokens + step.new_tokens) * model.kv_per_token  # read the old, write the new
    flops = (2 * model.layers * model.linear_params_per_layer * step.new_tokens
             + 2 * model.vocab * model.hidden * step.requests  # the LM head: last tokens only
             # q·k and p·v: 2 FLOPs per multiply-add, head_dim of each per pair and q head
             + 4 * model.layers * model.q_heads * model.head_dim * step.attention_pairs)
    return Cost((model.weights_read_per_step + embedding_rows) * dtype_bytes, kv * dtype_bytes,
                flops)


def decode_bucket(size: int) -> tuple[int, str]:
    """(index, "first–last") of the batch-size bucket that `size` falls in."""
    first = 1
    for i, last in enumerate(DECODE_BUCKETS):
        if size <= last:
            return i, f"{first}" if first == last else f"{first}–{last}"
        first = last + 1
    return len(DECODE_BUCKETS), f"{first}+"
