"""Typed wrappers over ZMQ sockets: one socket, one direction, objects in and out. The encoding
is passed in, so this bottom module knows no message type; IPC addresses carry a per-server run
id, so servers on one machine never share a socket."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

import zmq

T = TypeVar("T")


def new_run_id() -> str:
    """A name no other server on this machine uses: the pid plus a random suffix."""
    return f"{os.getpid()}-{uuid.uuid4().hex[:8]}"


def ipc_address(run_id: str, name: str) -> str:
    return f"ipc://{os.path.join(tempfile.gettempdir(), f'minisgl-{run_id}-{name}')}"


class _Queue(Generic[T]):
    _kind: int  # the ZMQ socket type, set by each queue class

    def __init__(self, address: str, bind: bool) -> None:
        self._socket = zmq.Context.instance().socket(self._kind)
        self._socket.setsockopt(zmq.LINGER, 0)  # closing never blocks on unsent messages
        if self._kind in (zmq.PUB, zmq.SUB):
            # A full PUB queue drops messages silently; for ranks that must see every message the
            # same, a backlog (memory) is better than a loss. Set before bind/connect to count.
            self._socket.setsockopt(zmq.SNDHWM, 0)
            self._socket.setsockopt(zmq.RCVHWM, 0)
        if self._kind == zmq.SUB:
            self._socket.setsockopt(zmq.SUBSCRIBE, b"")  # everything
        (self._socket.bind if bind else self._socket.connect)(address)
        self.address = address
        self._bound = bind

    def close(self) -> None:
        self._socket.close()
        # ZMQ leaves a bound IPC socket's file behind (it removes it on unbind only), and the
        # run id in its name means nobody will use it again.
        if self._bound and self.address.startswith("ipc://"):
            Path(self.address.removeprefix("ipc://")).unlink(missing_ok=True)


class _Sender(_Queue[T]):
    def __init__(self, address: str, bind: bool, encode: Callable[[T], bytes]) -> None:
        super().__init__(address, bind)
        self._encode = encode

    def put(self, obj: T) -> None:
        self._socket.send(self._encode(obj), copy=False)

    def put_raw(self, raw: bytes) -> None:
        """Forward bytes received elsewhere without decoding them (rank 0 -> other ranks)."""
        self._socket.send(raw, copy=False)


class _Receiver(_Queue[T]):
    def __init__(self, address: str, bind: bool, decode: Callable[[bytes], T]) -> None:
        super().__init__(address, bind)
        self._decode = decode

    def get_raw(self, timeout_ms: int | None = None) -> bytes | None:
        """The next message's bytes, or None if none arrives within timeout_ms."""
        if timeout_ms is not None and not self._socket.poll(timeout_ms):
            return None
        return self._socket.recv()

    def get(self, timeout_ms: int | None = None) -> T | None:
        raw = self.get_raw(timeout_ms)
        return None if raw is None else self._decode(raw)


class PushQueue(_Sender[T]):
    """One-to-one, in order: the sending end of a pipeline stage."""

    _kind = zmq.PUSH


class PullQueue(_Receiver[T]):
    _kind = zmq.PULL


class PubQueue(_Sender[T]):
    """One-to-many: every subscriber receives every message (rank 0 to the other ranks)."""

    _kind = zmq.PUB


class SubQueue(_Receiver[T]):
    _kind = zmq.SUB
