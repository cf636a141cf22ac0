from __future__ import annotations

from dataclasses import dataclass

import torch

from minisgl.core import Batch
from minisgl.kernel import cuda_kernels
from minisgl.utils import pin


# A smaller top_p (SamplingParams accepts 1e-300) is 0 in float32, which would mask even the
# most likely token; at this floor that token stays, as nothing is ranked before it.
TOP_P_FLOOR = torch.finfo(torch.float32).tiny


@dataclass
class SamplingArgs:
    """One batch's sampling parameters as device tensors, one entry per request. Sampler.prepare
    returns None instead when the whole batch is greedy, so the common case is one argmax."""

    temperatures: torch.Tensor  # [batch]; 0 marks a greedy request
    # None when no request of the batch filters: the filter sorts every row over the vocabulary
    top_k: torch.Tensor | None  # [batch] int; vocab_size means "no top-k"
    top_p: torch.Tensor | None  # [batch] float; 1.0 means "no top-p"


def top_k_top_p_filter(logits: torch.Tensor, top_k: torch.Tensor,
                       top_p: torch.Tensor) -> torch.Tensor:
    """Set to -inf every logit outside its row's top-k, then outside the smallest set of the
    remaining tokens whose renormalised probability reaches top_p (the top-1 always stays)."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[-1], device=logits.device)
    sorted_logits = sorted_logits.masked_fill(ranks >= top_k[:, None], float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # probability of the strictly better tokens
    sorted_logits = sorted_logits.masked_fill(mass_before >= top_p[:, None], float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


class Sampler:
    """Next tokens for a batch in which every request has its own temperature, top-k and top-p.
    Random draws come from one seed, so a run is reproducible: the reference ops take them
    from a seeded generator, chapter 19's kernel from (seed, draw number)."""

    def __init__(self, device: torch.device, vocab_size: int, seed: int) -> None:
        self.device, self.vocab_size, self.seed = device, vocab_size, seed
        self.generator = torch.Generator(device).manual_seed(seed)
        self.draws = 0  # calls of the kernel so far: each one gets uniforms of its own

    def prepare(self, batch: Batch) -> SamplingArgs | None:
        params = [req.sampling_params for req in batch.reqs]
        if all(p.is_greedy for p in params):
            return None
        rows = [[0.0 if p.is_greedy else p.temperature for p in params]]
        filtering = any(not p.is_greedy and (p.top_k >= 1 or p.top_p < 1.0) for p in params)
        if filtering:
            # -1 or beyond the vocabulary: the whole vocabulary (float32 rounds a huge top_k to
            # 2**63, which .long() turns negative: every token would be masked)
            rows += [[float(min(p.top_k, self.vocab_size) if p.top_k >= 1 else self.vocab_size)
                      for p in params], [max(p.top_p, TOP_P_FLOOR) for p in params]]
        # One pinned copy: a pageable one would make the host wait for the device.
        values = pin(torch.tensor(rows), self.device).to(self.device, non_blocking=True)
        if not filtering:
            return SamplingArgs(values[0], None, None)
        return SamplingArgs(values[0], values[1].long(), values[2])

    def sample(self, logits: torch.Tensor, args: SamplingArgs | None) -> torch.Tensor:
        if args is None:
            return logits.argmax(dim=-1)
        if args.top_k is None and cuda_kernels.target_for(logits):
            # chapter 19: one pass over the logits instead of the ten or so below
            tokens = cuda_kernels.sample(logits, args.temperatures, self.seed, self.draws)
            if tokens is not None:
                self.draws += 1
                return tokens
        greedy = logits.argmax(dim=-1)
        scaled = logits.float() / args.temperatures.clamp(min=1e-6)[:, None]
        if args.top_k is not None and args.top_p is not None:
            scaled = top_k_top_p_filter(scaled, args.top_k, args.top_p)
        probs = scaled.softmax(dim=-1)
        sampled = torch.multinomial(probs, 1, generator=self.generator).squeeze(1)
        return torch.where(args.temperatures == 0, greedy, sampled)
