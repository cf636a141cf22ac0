"""The engine: model, KV pool, attention backend and sampler behind one forward_batch call."""

from .config import EngineConfig
from .engine import Engine, ForwardOutput
from .sampler import Sampler, SamplingArgs, top_k_top_p_filter
