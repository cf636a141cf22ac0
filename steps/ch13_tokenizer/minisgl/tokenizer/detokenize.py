from __future__ import annotations

from typing import TYPE_CHECKING

from minisgl.message import DetokenizeMsg, UserReply

if TYPE_CHECKING:  # for annotations only: importing transformers takes a second
    from transformers import PreTrainedTokenizerBase

REPLACEMENT = "\ufffd"  # what decoding prints for bytes that are not a whole character yet


class IncrementalDetokenizer:
    """Turns one request's tokens into text as they arrive, so that the pieces joined equal
    decoding all the tokens at once.

    Decoding each token alone is wrong twice over: a character of several UTF-8 bytes may be
    split over tokens (each half decodes to U+FFFD), and some tokenizers print a token
    differently after a neighbour (SentencePiece's leading space). So every step decodes a short
    window: `prefix` tokens already turned into text, plus the tokens not yet turned. Whatever
    the window prints beyond the prefix's text is new, unless it ends in U+FFFD: then the
    character is incomplete and we wait for the next token.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0  # ids[prefix_offset:read_offset]: context, already emitted
        self.read_offset = 0  # ids[read_offset:]: not yet emitted

    def _decode(self, ids: list[int]) -> str:
        # Special tokens (the end-of-turn token ending a chat answer) are not text.
        return self.tokenizer.decode(ids, skip_special_tokens=True,
                                     clean_up_tokenization_spaces=False)

    def _pending_text(self) -> str:
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        return self._decode(self.ids[self.prefix_offset :])[len(prefix) :]

    def add(self, token: int) -> str:
        """The text `token` completes; "" while a character is still incomplete."""
        self.ids.append(token)
        new = self._pending_text()
        if not new or new.endswith(REPLACEMENT):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return new

    def finish(self) -> str:
        """Whatever is still held back once no more tokens will come."""
        new = self._pending_text()
        self.prefix_offset = self.read_offset = len(self.ids)
        return new


class DetokenizeManager:
    """The incremental state of every request that is streaming, keyed by uid."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.streams: dict[int, IncrementalDetokenizer] = {}

    def detokenize(self, msg: DetokenizeMsg) -> UserReply:
        stream = self.streams.setdefault(msg.uid, IncrementalDetokenizer(self.tokenizer))
        text = stream.add(msg.next_token) if msg.next_token >= 0 else ""
        if msg.finished:
            text += stream.finish()
            del self.streams[msg.uid]
        return UserReply(msg.uid, text, msg.finished, msg.error)
