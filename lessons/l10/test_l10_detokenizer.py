"""Lesson 10: the incremental detokenizer, without a server.

Run: pytest lessons/l10/test_l10_detokenizer.py

The server streams one text piece per generated token (:class:`~minisgl.detokenizer.TextStream`
in the tokenizer worker). The invariant the lesson states: the pieces join to exactly
``tokenizer.decode(all_ids, skip_special_tokens=True)``, whatever the tokens: pieces of a
character split over tokens, special tokens, several tokens at once. And the faster decode the
detokenizer uses (:func:`~minisgl.detokenizer.text_decoder`) gives the same text as
``tokenizer.decode`` on every window it is asked for.
"""

from __future__ import annotations

import functools
import random

import pytest

from minisgl.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer, TextStream, text_decoder
from minisgl.testing import tiny_checkpoint
from minisgl.tokenizer import load_tokenizer

ARCHS = ["qwen3", "llama"]


@functools.cache
def tokenizer(arch: str):
    return load_tokenizer(tiny_checkpoint(arch))


def random_ids(rng: random.Random, vocab: int, specials: list[int], n: int) -> list[int]:
    """``n`` ids: mostly any token of the vocabulary (single bytes included, so characters get
    split over tokens), now and then a special token."""
    return [rng.choice(specials) if rng.random() < 0.05 else rng.randrange(vocab) for _ in range(n)]


@pytest.mark.parametrize("arch", ARCHS)
def test_streamed_pieces_join_to_the_whole_decode(arch: str) -> None:
    tok = tokenizer(arch)
    rng = random.Random(0)
    split_characters = 0
    for _ in range(60):
        ids = random_ids(rng, len(tok), tok.all_special_ids, rng.randrange(1, 40))
        detok = IncrementalDetokenizer(tok)
        pieces, i = [], 0
        while i < len(ids):
            step = rng.choice([1, 1, 1, 2, 3])  # one token a step, sometimes a few (a speculative step)
            pieces.append(detok.add(ids[i:i + step]))
            i += step
        pieces.append(detok.flush())
        whole = tok.decode(ids, skip_special_tokens=True)
        assert "".join(pieces) == whole, ids
        assert all(REPLACEMENT_CHAR not in p for p in pieces[:-1]) or REPLACEMENT_CHAR in whole, ids
        split_characters += "" in pieces[:-1]
    assert split_characters > 0  # some tokens ended inside a character: the held-back path ran


@pytest.mark.parametrize("arch", ARCHS)
def test_fast_decode_equals_the_tokenizers_on_every_window(arch: str) -> None:
    tok = tokenizer(arch)
    fast = text_decoder(tok)
    assert fast.func == tok.backend_tokenizer.decode  # these tokenizers take the fast path
    rng = random.Random(1)
    for _ in range(300):
        ids = random_ids(rng, len(tok), tok.all_special_ids, rng.randrange(0, 12))
        assert fast(ids) == tok.decode(ids, skip_special_tokens=True), ids


def test_a_tokenizer_that_cleans_up_spaces_keeps_its_own_decode() -> None:
    tok = tokenizer("qwen3")

    class CleansUp:  # a fast tokenizer whose decode rewrites the backend's text
        backend_tokenizer = tok.backend_tokenizer
        clean_up_tokenization_spaces = True

        def decode(self, ids, skip_special_tokens=False):
            return tok.decode(ids, skip_special_tokens=skip_special_tokens).replace(" ,", ",")

    cleans = CleansUp()
    assert text_decoder(cleans).func == cleans.decode
    ids = tok.encode("a , b", add_special_tokens=False)
    stream = TextStream(cleans)
    assert stream.add(ids) + stream.finish() == "a, b"
