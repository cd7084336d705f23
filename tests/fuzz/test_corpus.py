"""The corpus is a pure function of (protocol, index): making an input changes nothing
that later inputs are made from, so an input found at index i comes back by itself, at
any corpus size (`FUZZ_INPUTS`)."""

from __future__ import annotations

import copy

from tests.fuzz import corpus

SEED = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 2, "stop": ["x"]}


def test_making_inputs_leaves_the_shared_tables_as_they_were() -> None:
    tables = copy.deepcopy((corpus.HOSTILE, corpus.RETYPES))
    alone = [corpus.json_input(SEED, corpus.rng("purity", i)) for i in (5, 1500)]
    for i in range(2000):
        corpus.json_input(SEED, corpus.rng("purity", i))
    assert tables == (corpus.HOSTILE, corpus.RETYPES)
    assert [corpus.json_input(SEED, corpus.rng("purity", i)) for i in (5, 1500)] == alone
