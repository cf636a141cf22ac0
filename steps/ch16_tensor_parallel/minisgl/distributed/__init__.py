"""Tensor parallelism's bookkeeping: which rank this process is, and its collectives."""

from .comm import (Communicator, SingleRank, TorchDistributed, destroy_distributed, get_comm,
                   init_distributed)
from .info import TPInfo, get_tp_info, set_tp_info
