"""FlashAttention-3-class prefill on Hopper, with FlashInfer's decode: the pairing the official
code defaults to on an H100/H200."""

from __future__ import annotations

import torch

from .flashinfer_backend import FlashInferBackend


class FlashAttentionBackend(FlashInferBackend):
    """Prefill with FlashInfer's "fa3" kernels, FlashAttention-3's design for Hopper; decode,
    which reads each key once and multiplies little, and everything else are inherited."""

    prefill_kernels = "fa3"

    @classmethod
    def unsupported_reason(cls, device: torch.device, dtype: torch.dtype,
                           head_dim: int) -> str | None:
        reason = super().unsupported_reason(device, dtype, head_dim)
        if reason is None and torch.cuda.get_device_capability(device)[0] != 9:
            major, minor = torch.cuda.get_device_capability(device)
            reason = (f"FA3 kernels need a Hopper GPU (sm_90), and this one is sm_{major}{minor}; "
                      "use --attn flashinfer")
        return reason
