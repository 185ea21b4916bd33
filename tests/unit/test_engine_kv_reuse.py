"""The reference engine's prefix cache (runtime/engine/kv_reuse.PrefixCache): an LRU
bounded by entries and by the tokens its entries hold, as TensorRT-LLM's KV
pool bounds what it keeps for reuse by blocks."""

from __future__ import annotations

from typing import Any

import torch

from trtspec.runtime.engine.kv_reuse import PrefixCache, make_cache


def _cache(n: int) -> Any:
    return make_cache([(torch.zeros(1, 1, n, 2), torch.zeros(1, 1, n, 2))])


def _store(lru: PrefixCache, start: int, n: int) -> list[int]:
    tokens = list(range(start, start + n))
    lru.store(tokens, _cache(n))
    return tokens


def test_the_token_budget_evicts_the_least_recently_used() -> None:
    lru = PrefixCache(capacity=8, max_tokens=20)
    a, b = _store(lru, 100, 8), _store(lru, 200, 8)
    assert (len(lru), lru.tokens) == (2, 16)
    assert lru.lookup([*a, 0])[0] == 8  # a is now the most recent
    c = _store(lru, 300, 8)  # 24 tokens > 20: b, the least recent, goes
    assert (len(lru), lru.tokens) == (2, 16)
    assert [lru.lookup([*p, 0])[0] for p in (a, b, c)] == [8, 0, 8]


def test_the_entry_count_still_bounds_short_entries() -> None:
    lru = PrefixCache(capacity=2, max_tokens=1000)
    prompts = [_store(lru, 100 * i, 3) for i in range(1, 4)]
    assert (len(lru), lru.tokens) == (2, 6)
    assert [lru.lookup([*p, 0])[0] for p in prompts] == [0, 3, 3]


def test_an_entry_over_the_whole_budget_is_not_kept_and_evicts_nothing() -> None:
    lru = PrefixCache(capacity=4, max_tokens=10)
    kept = _store(lru, 100, 6)
    _store(lru, 200, 11)
    assert (len(lru), lru.tokens) == (1, 6) and lru.lookup([*kept, 0])[0] == 6


def test_an_extended_sequence_replaces_its_prefix_and_the_count_follows() -> None:
    lru = PrefixCache(capacity=4, max_tokens=100)
    _store(lru, 100, 5)
    _store(lru, 100, 9)  # the same sequence, longer: the 5-token entry is redundant
    _store(lru, 100, 7)  # inside the 9-token entry: refreshes it, adds nothing
    assert (len(lru), lru.tokens) == (1, 9)
    lru.clear()
    assert (len(lru), lru.tokens) == (0, 0)


def test_the_engine_budget_is_a_full_batch_of_its_longest_sequences(every_mode_engines) -> None:
    from trtspec.runtime.engine import ReferenceEngine

    engine = ReferenceEngine.load(every_mode_engines["none"], threads=1)
    cfg = engine.config
    assert engine.prefix_cache.max_tokens == cfg.max_batch_size * cfg.max_seq_len
