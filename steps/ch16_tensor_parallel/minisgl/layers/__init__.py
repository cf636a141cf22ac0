"""Layers: small operators that declare their parameters by name and call the kernels."""

from .activation import SiluAndMul
from .attention import AttentionLayer
from .base import BaseOP, OPList, meta_param
from .embedding import Embedding, LMHead, vocab_shard
from .linear import Linear, MergedLinear, QKVLinear, RowParallelLinear
from .norm import FusedAddRMSNorm, RMSNorm
from .rotary import RotaryEmbedding, rope_inv_freq
