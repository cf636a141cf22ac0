"""The OpenAI request bodies we accept, and what we answer with."""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, Field

from minisgl.core import SamplingParams

# Any top_k at least the vocabulary size keeps every token; this bound only keeps the value
# small enough for msgpack and the sampler's tensors (no vocabulary comes near it).
MAX_TOP_K = 2**31 - 1


class APIError(Exception):
    """An error the client caused: answered with an OpenAI-style body and a 4xx status."""

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
    """Fields both endpoints share. Out-of-range values are checked by SamplingParams."""

    model: str | None = None  # there is one model: any name is accepted
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # not in OpenAI's API; clients send it in extra_body
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def sampling_params(self, max_seq_len: int, default_max_tokens: int | None
                        ) -> tuple[SamplingParams, bool]:
        """SamplingParams, and whether max_tokens is "as many as fit" (not given, no default)."""
        if self.n != 1:
            raise APIError(f"n must be 1, got {self.n}", param="n")
        if self.top_k > MAX_TOP_K:
            raise APIError(f"top_k must be -1 (no limit) or at most {MAX_TOP_K}, got {self.top_k}",
                           param="top_k")
        max_tokens = self.max_tokens if self.max_tokens is not None else default_max_tokens
        if max_tokens is not None and max_tokens >= max_seq_len:
            raise APIError(f"max_tokens is {max_tokens}, but this server's context holds "
                           f"{max_seq_len} tokens, prompt included", param="max_tokens")
        try:
            params = SamplingParams(temperature=self.temperature, top_k=self.top_k,
                                    top_p=self.top_p, ignore_eos=self.ignore_eos,
                                    max_tokens=max_seq_len if max_tokens is None else max_tokens)
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


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


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
