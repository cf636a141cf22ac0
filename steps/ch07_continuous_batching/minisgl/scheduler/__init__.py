"""The scheduler: which requests the engine computes at each step, and where their KV lives."""

from .config import SchedulerConfig
from .scheduler import Scheduler, TokenOutput
