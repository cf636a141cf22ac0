from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minisgl.core import SamplingParams


@dataclass
class TokenizeMsg:
    """API server -> tokenizer: a prompt as text, or a chat as a list of {role, content}."""

    uid: int
    prompt: str | list[dict[str, str]]
    sampling_params: SamplingParams


@dataclass
class UserMsg:
    """Tokenizer -> scheduler: the tokenized request."""

    uid: int
    input_ids: torch.Tensor  # 1-D int32 on the CPU
    sampling_params: SamplingParams


@dataclass
class DetokenizeMsg:
    """Scheduler -> detokenizer: one new token of one request."""

    uid: int
    next_token: int
    finished: bool


@dataclass
class UserReply:
    """Detokenizer -> API server: the text the new token completed, and whether it was the last."""

    uid: int
    incremental_output: str
    finished: bool


@dataclass
class AbortMsg:
    """The client is gone: stop the request and free what it holds."""

    uid: int


@dataclass
class ExitMsg:
    """Shut the receiving process down."""


@dataclass
class BatchMsg:
    """Several messages sent as one: one ZMQ send and one decode instead of many."""

    messages: list[Message] = field(default_factory=list)


Message = TokenizeMsg | UserMsg | DetokenizeMsg | UserReply | AbortMsg | ExitMsg | BatchMsg
