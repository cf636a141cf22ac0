"""The OpenAI request bodies we accept, and what we answer with."""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from minisgl.core import SamplingParams

# Any top_k at least the vocabulary size keeps every token; this bound only keeps the value
# small enough for msgpack and the sampler's tensors (no vocabulary comes near it).
MAX_TOP_K = 2**31 - 1

# Fields of OpenAI's API that this server does not implement, each with the values that ask for
# nothing (null too), which clients send anyway; any other value is refused, never ignored.
NEUTRAL_VALUES: dict[str, tuple[Any, ...]] = {
    "n": (1,),
    "best_of": (1,),
    "logprobs": (False,),  # chat's is a flag; completions' a count, and even 0 asks for some
    "top_logprobs": (0,),
    "echo": (False,),
    "suffix": ("",),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "logit_bias": ({},),
    "seed": (),
    "response_format": ({"type": "text"},),
    "tools": ([],),
    "tool_choice": ("none",),
    "functions": ([],),
    "function_call": ("none",),
    "modalities": (["text"],),
    "audio": (),
}


def _same(value: Any, neutral: Any) -> bool:
    """JSON equality: true is not 1 (Python's True == 1), but 0.0 is 0."""
    if isinstance(value, bool) or isinstance(neutral, bool):
        return value is neutral
    return value == neutral


def refuse_unsupported(fields: dict[str, Any]) -> None:
    """Raise an APIError naming the first unsupported field set to something it cannot mean
    here (fields: the request's fields that its model does not declare)."""
    for name, neutral in NEUTRAL_VALUES.items():
        value = fields.get(name)
        if value is None or any(_same(value, ok) for ok in neutral):
            continue
        shown = json.dumps(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        accepted = " or ".join(json.dumps(ok) for ok in (*neutral, None))
        raise APIError(f"{name} must be {accepted} (this server does not implement other "
                       f"values), got {shown}", param=name)


class APIError(Exception):
    """An error answered with an OpenAI-style body: a 4xx status when the client caused it."""

    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message, self.status, self.param, self.kind = message, status, param, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": None}}


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    """Fields both endpoints share. Out-of-range values are checked by SamplingParams; fields
    not declared here are kept (model_extra) so that unsupported ones can be refused by name."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None  # there is one model: any name is accepted
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # not in OpenAI's API; clients send it in extra_body
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def sampling_params(self, default_max_tokens: int | None) -> tuple[SamplingParams, bool]:
        """SamplingParams, and whether max_tokens is "as many as fit" (not given, no default).
        fit_max_tokens decides whether it fits, in the scheduler, where the prompt is counted."""
        refuse_unsupported(self.model_extra or {})
        if self.top_k > MAX_TOP_K:
            raise APIError(f"top_k must be -1 (no limit) or at most {MAX_TOP_K}, got {self.top_k}",
                           param="top_k")
        max_tokens = self.max_tokens if self.max_tokens is not None else default_max_tokens
        try:
            params = SamplingParams(temperature=self.temperature, top_k=self.top_k,
                                    top_p=self.top_p, ignore_eos=self.ignore_eos,
                                    max_tokens=1 if max_tokens is None else max_tokens)
        except ValueError as e:
            raise APIError(str(e)) from None
        return params, max_tokens is None


class CompletionRequest(SamplingFields):
    prompt: str


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None  # OpenAI's newer name for max_tokens


def completion_body(uid: int, model: str, chat: bool, text: str, finish_reason: str | None,
                    stream: bool) -> dict:
    """A response (stream=False) or one streamed chunk, for either endpoint."""
    if chat:
        content = {"delta": {"content": text}} if stream else {
            "message": {"role": "assistant", "content": text}}
        obj = "chat.completion.chunk" if stream else "chat.completion"
    else:
        content = {"text": text, "logprobs": None}
        obj = "text_completion"
    return {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uid}", "object": obj,
            "created": int(time.time()), "model": model,
            "choices": [{"index": 0, **content, "finish_reason": finish_reason}]}
