"""Legal ranges of the per-request generation parameters, defined once.

The spec schema (``bench.seed``, ``bench.temperatures``, ``bench.top_p``,
``bench.top_k``), the bench CLI, the router, the orchestrator and the
reference engine model all check a request's sampling values and lengths
here, so a value is refused with the same words wherever it enters. The
ranges are TensorRT-LLM's own (``executor::SamplingConfig`` checks
``temperature >= 0``, ``0 < topP <= 1``, ``topK >= 0``, ``minTokens >= 0``;
the seed is a ``RandomSeedType`` = ``std::uint64_t``; lengths are
``SizeType32``), tightened where TRT-LLM lets a value through that cannot
mean anything (a NaN or infinite temperature). The messages follow the LLM
API's wording (``"truncate_prompt_tokens must be >= 1, got 0"``).

No Triton, numpy or pydantic here: the Python models import this inside a
Triton stub.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

SEED_MAX = 2**64 - 1  # RandomSeedType is std::uint64_t; the tensor is UINT64
INT32_MAX = 2**31 - 1  # SizeType32: top_k, lengths, draft counts
# A benchmark policy, not a legality rule: hotter sampling measures noise.
BENCH_TEMPERATURE_MAX = 2.0


# Marks a client's error in a model's error message. On 2.51 a BLS caller sees
# every callee error as INTERNAL (python_backend keeps the message, drops the
# code), so callers recognise a callee's client error by this mark.
CLIENT_ERROR = "invalid request"


class ParamError(ValueError):
    """A request parameter outside its legal range: the client's error."""


def decode_text(name: str, value: object) -> str:
    """A STRING tensor element as text; bytes that are not UTF-8 are the
    client's error (``ParamError`` naming the input and the first bad byte)."""
    if not isinstance(value, bytes):
        return str(value)
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ParamError(
            f"{name} must be UTF-8 text, got byte 0x{value[exc.start]:02X} at position {exc.start}"
        ) from None


def temperature_problem(value: float) -> str | None:
    if not math.isfinite(value) or value < 0:
        return "must be a finite number >= 0 (0 = greedy)"
    return None


def top_p_problem(value: float) -> str | None:
    if not 0 < value <= 1:  # NaN fails both comparisons
        return "must be in (0, 1] (1 = off)"
    return None


def top_k_problem(value: int) -> str | None:
    if not 0 <= value <= INT32_MAX:
        return f"must be an integer in [0, {INT32_MAX}] (0 = off)"
    return None


def seed_problem(value: int) -> str | None:
    if not 0 <= value <= SEED_MAX:
        return f"must be an unsigned 64-bit integer, in [0, {SEED_MAX}]"
    return None


def max_tokens_problem(value: int) -> str | None:
    if not 1 <= value <= INT32_MAX:
        return f"must be an integer in [1, {INT32_MAX}]"
    return None


def draft_tokens_request_problem(value: int) -> str | None:
    """``num_draft_tokens`` on any variant (drafting or not): never negative."""
    if not 0 <= value <= INT32_MAX:
        return f"must be an integer in [0, {INT32_MAX}]"
    return None


def draft_tokens_problem(value: int, max_draft_len: int) -> str | None:
    if not 0 <= value <= max_draft_len:
        return f"must be in [0, {max_draft_len}] (the variant's max_draft_len)"
    return None


def check(name: str, value: Any, problem: Callable[..., str | None], *args: Any) -> Any:
    """``value`` when legal, else ``ParamError("<name> <rule>, got <value>")``."""
    if hasattr(value, "item"):  # a numpy scalar read from a tensor
        value = value.item()
    found = problem(value, *args)
    if found is not None:
        raise ParamError(f"{name} {found}, got {value}")
    return value


def check_sampling(
    *,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    seed: int | None = None,
    max_tokens: int | None = None,
    names: dict[str, str] | None = None,
) -> None:
    """Check the given values (``None`` = not sent); ``names`` maps a value to
    the input name the caller knows it by (``top_k`` → ``runtime_top_k``)."""
    names = names or {}
    rules: list[tuple[str, Any, Callable[..., str | None]]] = [
        ("max_tokens", max_tokens, max_tokens_problem),
        ("temperature", temperature, temperature_problem),
        ("top_p", top_p, top_p_problem),
        ("top_k", top_k, top_k_problem),
        ("seed", seed, seed_problem),
    ]
    for key, value, problem in rules:
        if value is not None:
            check(names.get(key, key), value, problem)


def request_seed(base: int, index: int) -> int:
    """The seed of the ``index``-th request of a run seeded ``base``: consecutive,
    wrapping inside the unsigned 64-bit range so any legal base stays legal."""
    return (base + index) % (SEED_MAX + 1)
