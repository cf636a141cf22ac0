"""The offline interface: LLM.generate over the scheduler, in this process."""

from .llm import LLM
