"""msgpack encoding of the messages: dataclasses become maps tagged with their type name,
tensors become their dtype, shape and raw bytes. decode(encode(m)) rebuilds the same types."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack
import torch

from minisgl.core import SamplingParams

from .messages import MESSAGE_TYPES, Message

# Every dataclass that may appear inside a message, by the name written on the wire.
WIRE_TYPES: dict[str, type] = {cls.__name__: cls for cls in (*MESSAGE_TYPES, SamplingParams)}
TYPE_KEY, TENSOR_KEY = "__type__", "__tensor__"


# Scalars first: they are most of every message, and each check below costs a call.
_SCALARS = (int, float, str, bytes, type(None))
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}  # per message type: dataclasses.fields is slow


def _plain(value: Any) -> Any:
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, torch.Tensor):
        data = value.detach().cpu().contiguous()
        return {TENSOR_KEY: str(data.dtype).removeprefix("torch."), "shape": list(data.shape),
                "data": data.view(torch.uint8).numpy().tobytes()}
    names = _FIELD_NAMES.get(type(value))
    if names is None and dataclasses.is_dataclass(value) and not isinstance(value, type):
        if type(value).__name__ not in WIRE_TYPES:
            raise TypeError(f"{type(value).__name__} is not a message type")
        names = _FIELD_NAMES[type(value)] = tuple(f.name for f in dataclasses.fields(value))
    if names is None:
        return value
    return {TYPE_KEY: type(value).__name__, **{n: _plain(getattr(value, n)) for n in names}}


def _rebuild(value: Any) -> Any:
    if isinstance(value, list):
        return [_rebuild(v) for v in value]
    if not isinstance(value, dict):
        return value
    if TENSOR_KEY in value:
        dtype = getattr(torch, value[TENSOR_KEY])
        if not value["data"]:  # frombuffer refuses an empty buffer
            return torch.empty(value["shape"], dtype=dtype)
        # bytearray: a writable copy, so the tensor does not alias the received message
        flat = torch.frombuffer(bytearray(value["data"]), dtype=torch.uint8)
        return flat.view(dtype).reshape(value["shape"])
    if TYPE_KEY in value:
        cls = WIRE_TYPES.get(value[TYPE_KEY])
        if cls is None:
            raise TypeError(f"unknown message type {value[TYPE_KEY]!r}")
        return cls(**{k: _rebuild(v) for k, v in value.items() if k != TYPE_KEY})
    return {k: _rebuild(v) for k, v in value.items()}


def encode(message: Message) -> bytes:
    return msgpack.packb(_plain(message), use_bin_type=True)


def decode(raw: bytes) -> Message:
    return _rebuild(msgpack.unpackb(raw, raw=False))
