"""The core vocabulary every other module speaks: sampling parameters, requests, batches and the
process-global context that carries the current batch into the model."""

from .batch import AttentionMetadata, Batch, Phase
from .context import AttentionBackend, Context, get_global_ctx, set_global_ctx
from .req import Req
from .sampling import SamplingParams
