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
    # max_tokens was not given: generate until EOS or until the context is full. Only the
    # scheduler can turn that into a number, once the prompt's length is known.
    fit_to_context: bool = False


@dataclass
class UserMsg:
    """Tokenizer -> scheduler: the tokenized request."""

    uid: int
    input_ids: torch.Tensor  # 1-D int32 on the CPU
    sampling_params: SamplingParams
    fit_to_context: bool = False  # as in TokenizeMsg


@dataclass
class DetokenizeMsg:
    """Scheduler -> detokenizer: one new token of one request."""

    uid: int
    next_token: int  # -1 when the request ends without a token (see error)
    finished: bool
    error: str = ""  # why the request was refused or stopped, if it was
    finish_reason: str = ""  # on the last message: "stop" (EOS) or "length" (max_tokens)
    # Only the scheduler knows it (the API server never sees token ids); usage needs it.
    prompt_tokens: int = 0


@dataclass
class UserReply:
    """Detokenizer -> API server: the text the new token completed, and whether it was the last."""

    uid: int
    incremental_output: str
    finished: bool
    error: str = ""  # non-empty: the request failed and this reply is its last
    finish_reason: str = ""  # as in DetokenizeMsg
    prompt_tokens: int = 0


@dataclass
class AbortMsg:
    """The client is gone: stop the request and free what it holds."""

    uid: int


@dataclass
class StatsMsg:
    """API server -> scheduler: report your counters (free KV pages, running requests...)."""

    uid: int


@dataclass
class StatsReply:
    """Scheduler -> API server, passed on by the detokenizer."""

    uid: int
    stats: dict[str, int]


@dataclass
class ExitMsg:
    """Shut the receiving process down."""


@dataclass
class BatchMsg:
    """Several messages sent as one: one ZMQ send and one decode instead of many."""

    messages: list[Message] = field(default_factory=list)


Message = (TokenizeMsg | UserMsg | DetokenizeMsg | UserReply | AbortMsg | StatsMsg | StatsReply
           | ExitMsg | BatchMsg)
# The classes the codec may rebuild from the wire, and nothing else.
MESSAGE_TYPES: tuple[type, ...] = (TokenizeMsg, UserMsg, DetokenizeMsg, UserReply, AbortMsg,
                                   StatsMsg, StatsReply, ExitMsg, BatchMsg)


def unbatch(message: Message) -> list[Message]:
    """The messages a BatchMsg carries, or the message itself."""
    return list(message.messages) if isinstance(message, BatchMsg) else [message]


def batched(messages: list[Message]) -> Message:
    """One message for the wire: the message itself, or a BatchMsg of several."""
    return messages[0] if len(messages) == 1 else BatchMsg(messages)
