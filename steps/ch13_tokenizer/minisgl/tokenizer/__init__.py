"""Text to tokens and back, in a process of its own: chat templates, incremental detokenizing,
stop strings."""

from .detokenize import DetokenizeManager, IncrementalDetokenizer
from .stop import StopMatcher
from .tokenize import TokenizeManager

# Not worker.py, the process's entry: it imports transformers, which the API server (it takes
# StopMatcher from here) does not need. Children.start names it "minisgl.tokenizer.worker:...".
