from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Names -> implementations, so that a config string ("LlamaForCausalLM", "torch", "radix")
    picks a class and adding an implementation is one decorator."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, *names: str) -> Callable[[T], T]:
        def add(item: T) -> T:
            for name in names:
                if name in self._items:
                    raise ValueError(f"{self.kind} {name!r} is registered twice")
                self._items[name] = item
            return item

        return add

    def get(self, name: str) -> T:
        if name not in self._items:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}")
        return self._items[name]

    def names(self) -> list[str]:
        return sorted(self._items)
