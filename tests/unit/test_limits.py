"""trtspec.runtime.limits: the one definition of legal request values, its exact
messages, and its agreement with TensorRT-LLM's own sampling checks."""

from __future__ import annotations

import math

import pytest

from trtspec.runtime import limits
from trtspec.runtime.limits import ParamError, check_sampling

# TensorRT-LLM's executor::SamplingConfig checks (cpp/tensorrt_llm/executor/
# samplingConfig.cpp: checkTemperature, checkTopP, checkTopK; the seed is
# RandomSeedType = std::uint64_t in executor/types.h), read from the source
# at three versions around the pinned 1.1.0, where they are identical.
TRTLLM_ACCEPTS = {
    "temperature": lambda v: v >= 0,
    "top_p": lambda v: v > 0 and v <= 1,
    "top_k": lambda v: v >= 0,
    "seed": lambda v: 0 <= v <= 2**64 - 1,
}
SAMPLES = {
    "temperature": [0.0, 1e-6, 0.7, 2.0, 50.0, -1e-6, -1.0],
    "top_p": [1e-9, 0.5, 1.0, 0.0, -0.1, 1.0000001, 2.0],
    "top_k": [0, 1, 50, 2**31 - 1, -1, -50],
    "seed": [0, 1, 2**63, 2**64 - 1, 2**64, -1, 2**70],
}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_limits_accept_what_trtllm_accepts(name: str) -> None:
    for value in SAMPLES[name]:
        ours = True
        try:
            check_sampling(**{name: value})
        except ParamError:
            ours = False
        assert ours == TRTLLM_ACCEPTS[name](value), (name, value)


def test_limits_are_stricter_than_trtllm_on_meaningless_temperatures() -> None:
    # TRT-LLM's check lets +inf through (inf >= 0); a NaN fails it but reaches
    # the reference engine's sampler as an internal error: both are refused here.
    for value in (math.inf, math.nan, -math.inf):
        with pytest.raises(ParamError):
            check_sampling(temperature=value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"temperature": math.nan},
            "temperature must be a finite number >= 0 (0 = greedy), got nan",
        ),
        ({"temperature": -0.5}, "temperature must be a finite number >= 0 (0 = greedy), got -0.5"),
        (
            {"temperature": math.inf},
            "temperature must be a finite number >= 0 (0 = greedy), got inf",
        ),
        ({"top_p": 0.0}, "top_p must be in (0, 1] (1 = off), got 0.0"),
        ({"top_p": math.nan}, "top_p must be in (0, 1] (1 = off), got nan"),
        ({"top_k": -1}, "top_k must be an integer in [0, 2147483647] (0 = off), got -1"),
        (
            {"seed": 2**64},
            "seed must be an unsigned 64-bit integer, in [0, 18446744073709551615], "
            "got 18446744073709551616",
        ),
        ({"max_tokens": 0}, "max_tokens must be an integer in [1, 2147483647], got 0"),
        (
            {"top_k": -2, "names": {"top_k": "runtime_top_k"}},
            "runtime_top_k must be an integer in [0, 2147483647] (0 = off), got -2",
        ),
    ],
)
def test_messages(kwargs: dict, message: str) -> None:
    with pytest.raises(ParamError) as err:
        check_sampling(**kwargs)
    assert str(err.value) == message


def test_numpy_scalars_read_from_tensors_are_shown_plainly() -> None:
    import numpy as np

    with pytest.raises(ParamError) as err:
        check_sampling(temperature=np.float32("nan"))
    assert str(err.value).endswith(", got nan")


def test_num_draft_tokens_against_the_variant() -> None:
    assert limits.check("num_draft_tokens", 4, limits.draft_tokens_problem, 4) == 4
    with pytest.raises(ParamError) as err:
        limits.check("num_draft_tokens", 9, limits.draft_tokens_problem, 4)
    assert str(err.value) == (
        "num_draft_tokens must be in [0, 4] (the variant's max_draft_len), got 9"
    )


def test_request_seeds_stay_unsigned_64_bit() -> None:
    assert limits.request_seed(1234, 5) == 1239
    assert limits.request_seed(limits.SEED_MAX, 0) == limits.SEED_MAX
    assert limits.request_seed(limits.SEED_MAX, 1) == 0  # wraps, never overflows uint64
    assert limits.request_seed(limits.SEED_MAX - 1, 3) == 1
