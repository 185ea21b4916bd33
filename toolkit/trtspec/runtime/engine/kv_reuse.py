"""KV-cache plumbing: select/crop a cache, and reuse caches across requests.

The draft→verify loop of a BLS orchestrator sends every round as a new request
carrying the whole sequence so far; TensorRT-LLM avoids re-encoding it with
``enable_kv_cache_reuse`` (paged blocks matched by prefix). ``PrefixCache`` is
the reference backend's equivalent: a small LRU of finished requests' caches
keyed by the exact tokens they hold; a new request takes the entry with the
longest common prefix, cropped to that prefix (and to at most ``len(prompt)-1``
tokens, because the last prompt token must be fed to get its logits). Cached
tensors are never mutated in place (``KVCache`` and the HF dynamic cache grow
by concatenation), so entries can share storage with live requests safely.

The LRU is bounded by entries and by the tokens its entries hold
(``max_tokens``): TensorRT-LLM keeps reusable blocks in its KV pool, a fixed
number of blocks, and evicts the least recently used when it needs room, so
what it can reuse is bounded by tokens, not by requests. The engine sizes
the budget as the smallest pool that serves its own limits
(``max_batch_size × max_seq_len`` tokens, ``ReferenceEngine``); without it
the cache of long prompts grows with the entry count alone (16 entries of
1.5k tokens of SmolLM2-135M: 1.1 GB of float32 KV per engine).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


def cache_kwarg(module: Any) -> str:
    """The keyword a model's forward takes its cache by (renamed in transformers 5.x)."""
    import inspect

    params = inspect.signature(module.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class KVLayer:
    """One layer's cached keys and values, [1, kv_heads, positions, head_dim] each."""

    __slots__ = ("keys", "values")

    def __init__(self, keys: Any, values: Any) -> None:
        self.keys = keys
        self.values = values

    def get_seq_length(self) -> int:
        return int(self.keys.shape[-2])


class KVCache:
    """The engine's KV cache for the fast path (``fastpath.forward_packed``):
    per-layer (keys, values) tensors, the same ``layers`` / ``.keys`` /
    ``.values`` / ``get_seq_length`` shape as transformers' ``DynamicCache``,
    without importing transformers (``transformers.cache_utils`` alone costs
    an engine stub ~0.75 CPU-s to import). Layers grow by concatenation (a
    new tensor per step), never in place, like ``DynamicCache``'s. A Hugging
    Face forward (the non-fused fallback, the EAGLE layer) needs a real
    ``DynamicCache``: ``make_cache(hf=True)``."""

    __slots__ = ("layers",)

    def __init__(self, kv: list[tuple[Any, Any]] | None = None) -> None:
        self.layers = [KVLayer(k, v) for k, v in kv or ()]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        if len(self.layers) <= layer_idx:
            return 0
        return self.layers[layer_idx].get_seq_length()


def kv_tensors(cache: Any) -> list[tuple[Any, Any]]:
    """The per-layer (keys, values) tensors of a ``KVCache`` or an HF dynamic cache."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def make_cache(kv: list[tuple[Any, Any]] | None = None, *, hf: bool = False) -> Any:
    """A cache holding ``kv`` (views are fine: layers grow by concatenation):
    a ``KVCache``, or with ``hf`` a transformers ``DynamicCache`` (for a
    Hugging Face forward)."""
    if not hf:
        return KVCache(kv)
    from transformers import DynamicCache

    if not kv:
        return DynamicCache()
    cache = DynamicCache()
    layer_cls = getattr(cache, "layer_class_to_replicate", None)
    if layer_cls is not None and hasattr(layer_cls, "lazy_initialization"):
        # Adopt the tensors without the copy that ``update`` (cat onto empty) makes.
        cache.layers = []
        for keys, values in kv:
            layer = layer_cls()
            layer.lazy_initialization(keys, values)
            layer.keys, layer.values = keys, values
            cache.layers.append(layer)
        return cache
    return DynamicCache(ddp_cache_data=kv)


def is_hf_cache(cache: Any) -> bool:
    return not isinstance(cache, KVCache)


def replace_kv(cache: Any, kv: list[tuple[Any, Any]]) -> None:
    """Make ``cache`` (either kind, in place) hold ``kv``."""
    cache.layers = make_cache(kv, hf=is_hf_cache(cache)).layers


def cache_len(cache: Any) -> int:
    return int(cache.get_seq_length()) if cache is not None else 0


def select_cache(cache: Any, index: Any) -> Any:
    """A new cache of the same kind holding only sequence positions ``index`` (a LongTensor)."""
    return make_cache(
        [(k.index_select(-2, index), v.index_select(-2, index)) for k, v in kv_tensors(cache)],
        hf=is_hf_cache(cache),
    )


def crop_cache(cache: Any, length: int) -> Any:
    """A new cache of the same kind holding the first ``length`` positions."""
    return make_cache(
        [(k[..., :length, :], v[..., :length, :]) for k, v in kv_tensors(cache)],
        hf=is_hf_cache(cache),
    )


@dataclass
class CacheEntry:
    tokens: tuple[int, ...]
    kv: list[tuple[Any, Any]]
    features: Any = None  # [n, hidden] final hidden states, for EAGLE


def common_prefix(a: tuple[int, ...] | list[int], b: tuple[int, ...] | list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixCache:
    """LRU of recent sequences' KV caches, matched by longest common prefix:
    at most ``capacity`` entries holding at most ``max_tokens`` tokens in all
    (``None``: no token bound; an entry over the whole budget is not kept)."""

    def __init__(self, capacity: int = 4, max_tokens: int | None = None) -> None:
        self.capacity = capacity
        self.max_tokens = max_tokens
        self._entries: OrderedDict[int, CacheEntry] = OrderedDict()
        self._tokens = 0
        self._next = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        """Tokens the entries hold (their KV is what the cache keeps in memory)."""
        return self._tokens

    def _drop(self, key: int) -> None:
        self._tokens -= len(self._entries.pop(key).tokens)

    def clear(self) -> None:
        """Forget every entry (the next request encodes its prompt from scratch)."""
        with self._lock:
            self._entries.clear()
            self._tokens = 0

    def lookup(self, prompt: list[int]) -> tuple[int, CacheEntry | None]:
        """(reusable token count, entry) for ``prompt``; count <= len(prompt) - 1."""
        if self.capacity <= 0:
            return 0, None
        best, best_key, best_entry = 0, None, None
        with self._lock:
            for key, entry in self._entries.items():
                n = common_prefix(entry.tokens, prompt)
                if n > best:
                    best, best_key, best_entry = n, key, entry
            if best_key is not None:
                self._entries.move_to_end(best_key)
        return min(best, len(prompt) - 1), best_entry

    def store(self, tokens: list[int], cache: Any, features: Any = None) -> None:
        n = cache_len(cache)
        if self.capacity <= 0 or n == 0 or (self.max_tokens is not None and n > self.max_tokens):
            return
        entry = CacheEntry(tuple(tokens[:n]), kv_tensors(cache), features)
        with self._lock:
            # A sequence an entry already holds adds nothing (as in a block
            # radix tree): it only refreshes that entry. Stored anyway, every
            # round of a speculative request that repeats a cached prompt would
            # push one more entry into the LRU, so a speculative arm would
            # forget earlier prompts sooner than its baseline (issue 26 item 6).
            for key, held in self._entries.items():
                if common_prefix(held.tokens, entry.tokens) == len(entry.tokens) and (
                    features is None or held.features is not None
                ):
                    self._entries.move_to_end(key)
                    return
            # An entry that is a prefix of the new one is now redundant.
            for key in [
                k
                for k, e in self._entries.items()
                if common_prefix(e.tokens, entry.tokens) == len(e.tokens)
            ]:
                self._drop(key)
            self._entries[self._next] = entry
            self._tokens += n
            self._next += 1
            budget = self.max_tokens if self.max_tokens is not None else self._tokens
            while len(self._entries) > self.capacity or self._tokens > budget:
                self._drop(next(iter(self._entries)))  # the least recently used
