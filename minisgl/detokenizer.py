"""Lesson 10: turning a stream of token ids into a stream of text, and stopping at stop strings.

Two things make this harder than ``tokenizer.decode(new_token)``:

* **A token is not a character.** Byte-level BPE tokens are byte sequences; a character such as
  "é" or an emoji may be split over several tokens, and a token decoded alone can turn into a
  replacement character (U+FFFD). Some tokenizers also change how a token is written depending
  on its neighbours (a leading space). So :class:`IncrementalDetokenizer` decodes a short window
  of recent tokens, and emits only the text that window adds, once it no longer ends in U+FFFD.
* **A stop string may span tokens.** With ``stop=["\\n\\nUser:"]`` the model may produce
  ``"\\n"``, ``"\\nUser"``, ``":"``. By the time the match is complete, the first pieces must not
  have reached the client. :class:`StopStringFilter` holds back any tail of the text that is
  still the beginning of some stop string, and releases it only when it cannot be one any more.

Both are used by the server's tokenizer worker (one per request) and by the offline
``LLM.generate`` for ``SamplingParams.stop``.
"""

from __future__ import annotations

__lesson__ = 10

import functools
from collections.abc import Callable, Sequence

REPLACEMENT_CHAR = "\ufffd"


def text_decoder(tokenizer) -> Callable[[Sequence[int]], str]:
    """``ids -> tokenizer.decode(ids, skip_special_tokens=True)``: the same text, with less work
    per call where that is safe.

    A detokenizer decodes a short window twice per generated token, for every stream, so a
    server makes this call tens of thousands of times a second. A fast (Rust) tokenizer's
    ``decode`` spends most of its time in Python before it reaches Rust: transformers first
    converts ``ids`` to a list, checking each element's type. When the tokenizer would not
    rewrite the text afterwards (``clean_up_tokenization_spaces`` off, as for Qwen's and Llama's
    tokenizers), its backend's ``decode`` is called directly: the call transformers ends in.
    Anything else (a slow, Python-only tokenizer, or one that cleans up spaces) keeps
    ``tokenizer.decode``."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return functools.partial(backend.decode, skip_special_tokens=True)
    return functools.partial(tokenizer.decode, skip_special_tokens=True)


class IncrementalDetokenizer:
    """Text deltas for a growing list of generated token ids (special tokens skipped).

    Invariant: the concatenation of every delta returned by :meth:`add` and :meth:`flush`
    equals ``tokenizer.decode(all_ids, skip_special_tokens=True)`` at the end.
    ``prefix_offset:read_offset`` is the window already turned into text, kept as the context
    that the next tokens are decoded with.
    """

    def __init__(self, tokenizer) -> None:
        self._decode = text_decoder(tokenizer)  # ids -> text, special tokens skipped
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def add(self, token_ids: Sequence[int]) -> str:
        """Append ``token_ids`` and return the text they complete ("" if it is not complete yet)."""
        self.ids.extend(token_ids)
        before = self._decode(self.ids[self.prefix_offset : self.read_offset])
        after = self._decode(self.ids[self.prefix_offset :])
        if len(after) > len(before) and not after.endswith(REPLACEMENT_CHAR):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return after[len(before) :]
        return ""

    def peek(self, candidates: Sequence[int]) -> list[str]:
        """The text each of ``candidates`` would add of its own if it were the next token: what
        it adds after the text shown so far, without the pieces of a character that earlier
        tokens left pending. Nothing changes. When nothing is pending, that is what :meth:`add`
        would return for it, except that text ending inside a character is shown as it stands,
        with U+FFFD, instead of being held; a token that would complete a pending character has
        only the rest of it (U+FFFD), and a skipped special token has ``""``. The server names
        the tokens of log-probabilities with it."""
        window = self.ids[self.prefix_offset : self.read_offset]
        before = self._decode(window)
        return [self._decode(window + [c])[len(before) :] for c in candidates]

    def flush(self) -> str:
        """The text still held (an unfinished character, shown as U+FFFD) at the end."""
        before = self._decode(self.ids[self.prefix_offset : self.read_offset])
        after = self._decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return after[len(before) :]


class StopStringFilter:
    """Passes text through until one of ``stops`` appears; never lets out a stop string or any
    part of one.

    Invariant: ``held`` is the longest tail of the text seen so far that is a proper prefix of
    some stop string; everything before it has been returned. A stop string that appears ends
    the stream: :attr:`stopped` becomes True and only the text before it is returned.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """Add ``text``; return what can safely be shown now."""
        if self.stopped:
            return ""
        buffer = self.held + text
        if not self.stops:
            self.held = ""
            return buffer
        hits = [i for i in (buffer.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped, self.held = True, ""
            return buffer[: min(hits)]
        keep = self._partial_match_len(buffer)
        self.held = buffer[len(buffer) - keep :]
        return buffer[: len(buffer) - keep]

    def _partial_match_len(self, text: str) -> int:
        """Length of the longest tail of ``text`` that some stop string begins with."""
        longest = max(len(s) for s in self.stops) - 1
        for n in range(min(longest, len(text)), 0, -1):
            tail = text[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0

    def flush(self) -> str:
        """The stream ended without a stop string: the held tail is ordinary text after all."""
        out, self.held = ("" if self.stopped else self.held), ""
        return out


class TextStream:
    """One request's output text: detokenize, then filter stop strings.

    :meth:`add` returns the text to show for new tokens; :attr:`stopped` says a stop string
    ended it (the caller then aborts the request). :meth:`finish` returns the held text when
    the request ends for another reason. :attr:`text` is everything shown so far, :attr:`raw`
    everything detokenized so far (stop strings not cut): ``text`` is always a prefix of ``raw``.
    """

    def __init__(self, tokenizer, stop: Sequence[str] = ()) -> None:
        self.detokenizer = IncrementalDetokenizer(tokenizer)
        self.filter = StopStringFilter(stop)
        self.text = ""
        self.raw = ""

    @property
    def stopped(self) -> bool:
        return self.filter.stopped

    @property
    def num_tokens(self) -> int:
        """Token ids added so far."""
        return len(self.detokenizer.ids)

    def add(self, token_ids: Sequence[int]) -> str:
        piece = self.detokenizer.add(token_ids)
        self.raw += piece
        out = self.filter.feed(piece)
        self.text += out
        return out

    def finish(self) -> str:
        if self.stopped:
            return ""
        piece = self.detokenizer.flush()
        self.raw += piece
        out = self.filter.feed(piece) + self.filter.flush()
        self.text += out
        return out
