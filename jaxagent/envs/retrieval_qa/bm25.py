"""BM25 over one task's pool (the Q&D spec's §1.3), through bm25s's sparse index.

Document text = ``title + " " + text``; tokens = maximal runs of ``[a-z0-9]`` after lowercasing
(no stemming, no stop words); queries are tokenised the same way and a repeated query token
counts once per occurrence. Okapi BM25 with k1 = 1.2, b = 0.75 and the always-positive
idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5)), computed inside the pool:

    score(d) = sum over query tokens q of idf(q) * f * (k1 + 1) / (f + k1 * (1 - b + b * |d| / avgdl))

bm25s's ``lucene`` variant is this score without the constant factor (k1 + 1), which `PoolIndex`
puts back so that scores are the spec's numbers (`bm25_scores_reference` is a plain loop over the
formula; the tests hold the two together). `PoolIndex.search` returns the top-k pool indices with
a positive score, by score descending, ties by ascending pool index; a query with no positive
score returns nothing.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

import numpy as np

K1, B = 1.2, 0.75
_TOKEN = re.compile(r"[a-z0-9]+")


def tokenize(text: str) -> list[str]:
    """Maximal ASCII ``[a-z0-9]`` runs of the lowercased text (anything else separates)."""
    return _TOKEN.findall(text.lower())


class PoolIndex:
    """A BM25 index over one pool of (title, text) documents (pool index = position)."""

    def __init__(self, docs: Sequence[tuple[str, str]], *, k1: float = K1, b: float = B):
        import logging

        import bm25s

        logging.getLogger("bm25s").setLevel(logging.WARNING)  # bm25s sets its logger to DEBUG: a line per index
        self.k1, self.b = k1, b
        self.n = len(docs)
        self.tokens = [tokenize(f"{title} {text}") for title, text in docs]
        self._vocab = {t for doc in self.tokens for t in doc}
        self._bm25 = None
        if self._vocab:  # bm25s cannot index a pool with no token at all
            self._bm25 = bm25s.BM25(k1=k1, b=b, method="lucene", dtype="float64")
            self._bm25.index(self.tokens, show_progress=False)

    def scores(self, query: str) -> np.ndarray:
        """[N] float64: each document's BM25 score for ``query`` (0 for terms absent from the pool)."""
        q = [t for t in tokenize(query) if t in self._vocab]
        if self._bm25 is None or not q:
            return np.zeros(self.n)
        return np.asarray(self._bm25.get_scores(q), np.float64) * (self.k1 + 1)

    def search(self, query: str, k: int) -> list[int]:
        """The top-``k`` pool indices with score > 0 (descending score, ties by pool index)."""
        if k < 1:
            raise ValueError(f"k={k!r}: expected an integer >= 1")
        s = self.scores(query)
        order = sorted(range(self.n), key=lambda i: (-s[i], i))
        return [i for i in order[:k] if s[i] > 0]


def bm25_scores_reference(docs: Sequence[tuple[str, str]], query: str, *, k1: float = K1, b: float = B,
                          ) -> list[float]:
    """The formula of the module docstring as a plain loop (the reference the index is tested against)."""
    toks = [tokenize(f"{t} {x}") for t, x in docs]
    n = len(toks)
    avgdl = sum(map(len, toks)) / n if n else 0.0
    df = Counter(t for d in toks for t in set(d))
    out = []
    for d in toks:
        tf = Counter(d)
        s = 0.0
        for q in tokenize(query):
            f = tf.get(q, 0)
            if f == 0:
                continue
            idf = math.log(1 + (n - df[q] + 0.5) / (df[q] + 0.5))
            s += idf * f * (k1 + 1) / (f + k1 * (1 - b + b * len(d) / avgdl))
        out.append(s)
    return out


__all__ = ["PoolIndex", "bm25_scores_reference", "tokenize"]
