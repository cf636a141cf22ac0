"""The OpenAI-compatible API server, its launcher and the interactive shell.

The names below are imported when first used: `python -m minisgl --help` imports `server.args`
alone, without the launcher's torch, uvicorn and scheduler."""

from importlib import import_module

_HOMES = {"ServerArgs": ".args", "parse_args": ".args", "Backend": ".launch", "main": ".launch",
          "start_backend": ".launch"}


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_HOMES[name], __name__), name)


__all__ = ["Backend", "ServerArgs", "main", "parse_args", "start_backend"]
