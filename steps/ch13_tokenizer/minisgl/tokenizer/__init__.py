"""Text to tokens and back, in a process of its own: chat templates, incremental detokenizing,
stop strings."""

from .detokenize import DetokenizeManager, IncrementalDetokenizer
from .stop import StopMatcher
from .tokenize import TokenizeManager
from .worker import TokenizerWorker, run_tokenizer
