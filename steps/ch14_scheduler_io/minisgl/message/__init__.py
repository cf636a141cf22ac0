"""Messages between the processes (API server, tokenizer, schedulers) and their wire format."""

from .codec import decode, encode
from .messages import (AbortMsg, BatchMsg, DetokenizeMsg, ExitMsg, Message, StatsMsg, StatsReply,
                       TokenizeMsg, UserMsg, UserReply, batched, unbatch)
