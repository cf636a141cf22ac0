"""The OpenAI-compatible API server, its launcher and the interactive shell."""

from .args import ServerArgs, parse_args
from .launch import Backend, main, start_backend

__all__ = ["Backend", "ServerArgs", "main", "parse_args", "start_backend"]
