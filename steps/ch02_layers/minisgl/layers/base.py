from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Generic, TypeVar

import torch


def meta_param(*shape: int) -> torch.Tensor:
    """A parameter slot with a shape and no storage. Loading replaces it with the real tensor, so
    building a model costs no memory, and a slot that was never loaded stays on "meta"."""
    return torch.empty(*shape, device="meta")


class BaseOP:
    """An operator without nn.Module's machinery. Its parameters are its public tensor
    attributes, its children are its public BaseOP attributes; the names of both, joined with
    dots, are the checkpoint's tensor names ("layers.3.self_attn.qkv_proj.weight")."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def named_children(self) -> Iterator[tuple[str, BaseOP]]:
        for name, value in vars(self).items():
            if not name.startswith("_") and isinstance(value, BaseOP):
                yield name, value

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
        for name, value in vars(self).items():
            if not name.startswith("_") and isinstance(value, torch.Tensor):
                yield prefix + name, value
        for name, child in self.named_children():
            yield from child.named_parameters(f"{prefix}{name}.")

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.named_parameters())

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Take every parameter from `state` by name. A missing name, a name nobody declared and
        a shape that does not fit all fail, each naming the tensor."""
        expected = self.state_dict()
        missing = sorted(expected.keys() - state.keys())
        unexpected = sorted(state.keys() - expected.keys())
        if missing:
            raise KeyError(f"checkpoint is missing {len(missing)} tensor(s), e.g. {missing[:3]}")
        if unexpected:
            raise KeyError(f"checkpoint has {len(unexpected)} unexpected tensor(s), "
                           f"e.g. {unexpected[:3]}")
        for name, slot in expected.items():
            if state[name].shape != slot.shape:
                raise ValueError(f"tensor {name!r} has shape {tuple(state[name].shape)}; "
                                 f"the model expects {tuple(slot.shape)}")
        for name, tensor in state.items():
            self._set(name, tensor)

    def _set(self, name: str, tensor: torch.Tensor) -> None:
        head, _, rest = name.partition(".")
        if not rest:
            setattr(self, head, tensor)
        else:
            dict(self.named_children())[head]._set(rest, tensor)


T = TypeVar("T", bound=BaseOP)


class OPList(BaseOP, Generic[T]):
    """A list of operators named 0, 1, 2, ... like the checkpoint's layer indices."""

    def __init__(self, ops: list[T]) -> None:
        self.ops = ops

    def named_children(self) -> Iterator[tuple[str, BaseOP]]:
        for i, op in enumerate(self.ops):
            yield str(i), op

    def __getitem__(self, index: int) -> T:
        return self.ops[index]

    def __iter__(self) -> Iterator[T]:
        return iter(self.ops)

    def __len__(self) -> int:
        return len(self.ops)
