"""The OpenAI-compatible API server, its launcher and the interactive shell."""
