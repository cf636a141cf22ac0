from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    """Cuts a text stream at the first of its stop strings.

    The stream arrives in pieces, and a stop string may straddle two of them ("Obs" then
    "ervation:"). So the tail that could still be the start of a stop string is held back until
    the next piece settles it; it is released by a non-matching piece or by flush().
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.held = ""
        self.stopped = False

    def _held_back(self, text: str) -> int:
        """Length of the longest tail of `text` that is a proper prefix of a stop string."""
        longest = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:n]):
                    longest = n
                    break
        return longest

    def feed(self, piece: str) -> str:
        """The part of the stream that is certainly output. After a stop string is found,
        `stopped` is True and everything from the stop string on is dropped."""
        if self.stopped:
            return ""
        text = self.held + piece
        # The occurrence that *ends* first is the one a stream sees complete first, so the cut
        # does not depend on how the text was split (stops "abc" and "b" in "abc": cut at "b").
        hits = [(i + len(s), i) for s in self.stops if (i := text.find(s)) >= 0]
        if hits:
            self.stopped, self.held = True, ""
            return text[: min(hits)[1]]
        keep = self._held_back(text)
        self.held = text[len(text) - keep :]
        return text[: len(text) - keep]

    def flush(self) -> str:
        """The held-back tail, once the stream has ended without a stop string."""
        text, self.held = self.held, ""
        return text
