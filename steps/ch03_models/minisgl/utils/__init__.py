"""Small helpers shared by the upper modules."""

from .registry import Registry
