"""Sampling until decided (bench/sequential.py): the t quantile, the interval,
the look schedule, and the error rate under repeated looks by simulation."""

from __future__ import annotations

import io
import math
import random

import pytest

from trtspec.bench.sequential import (
    FASTER,
    SLOWER,
    UNDECIDED,
    SequentialPlan,
    paired_ratio_interval,
    simulate,
    t_quantile,
)


@pytest.mark.parametrize(
    ("p", "df", "expected"),
    [
        (0.975, 1, 12.7062),
        (0.975, 4, 2.7764),
        (0.975, 10, 2.2281),
        (0.995, 4, 4.6041),
        (0.975, 29, 2.0452),
        (0.9975, 5, 4.7733),
        (0.995, 5, 4.0321),
    ],
)
def test_t_quantile_matches_tables(p: float, df: int, expected: float) -> None:
    assert t_quantile(p, df) == pytest.approx(expected, rel=2e-3)


def test_interval_is_the_t_interval_on_log_ratios() -> None:
    base = [10.0, 12.0, 9.0, 11.0]
    var = [8.0, 10.0, 8.0, 9.0]
    logs = [math.log(b / v) for b, v in zip(base, var, strict=True)]
    mean = sum(logs) / 4
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 3)
    est = paired_ratio_interval(base, var, 0.95)
    assert est is not None
    assert est.point == pytest.approx(math.exp(mean))
    assert est.ci_low == pytest.approx(math.exp(mean - 3.1824 * sd / 2), rel=1e-3)
    assert est.ci_high == pytest.approx(math.exp(mean + 3.1824 * sd / 2), rel=1e-3)
    assert est.pairs == 4
    assert paired_ratio_interval([None, 1.0], [1.0, None]) is None


def test_look_schedule_and_level() -> None:
    plan = SequentialPlan(first=5, batch=5, maximum=30, alpha=0.05)
    assert plan.sizes == [5, 10, 15, 20, 25, 30]
    assert plan.confidence == pytest.approx(1 - 0.05 / 6)
    assert SequentialPlan(first=5, batch=4, maximum=15).sizes == [5, 9, 13, 15]
    assert SequentialPlan.fixed(12).sizes == [12]
    assert SequentialPlan.fixed(12).confidence == pytest.approx(0.95)
    assert SequentialPlan.from_dict(plan.as_dict()) == plan
    # a route's own requests cap it, at the run's per-look level
    short = plan.capped(12)
    assert (short.sizes, short.confidence) == ([5, 10, 12], pytest.approx(plan.confidence))
    assert plan.capped(5).sizes == [5]
    assert plan.capped(5).confidence == pytest.approx(plan.confidence)
    assert plan.capped(None) is plan and plan.capped(30) is plan


def _cell(
    rng: random.Random, speedup: float, sigma: float, n: int = 30
) -> list[tuple[float, float]]:
    out = []
    for _ in range(n):
        base = rng.uniform(20.0, 40.0)  # prompts differ a lot; pairing removes it
        out.append((base, base / speedup * math.exp(rng.gauss(0.0, sigma))))
    return out


def test_clear_win_stops_early() -> None:
    rng = random.Random(1)
    got, used = simulate(SequentialPlan(), _cell(rng, 1.8, 0.08), 1.05)
    assert (got, used) == (FASTER, 5)


def test_clear_loss_stops_early() -> None:
    rng = random.Random(2)
    got, used = simulate(SequentialPlan(), _cell(rng, 0.6, 0.08), 1.05)
    assert (got, used) == (SLOWER, 5)


def test_null_effect_runs_to_the_cap() -> None:
    rng = random.Random(3)
    got, used = simulate(SequentialPlan(), _cell(rng, 1.0, 0.01), 1.05)
    assert (got, used) == (UNDECIDED, 30)


def _false_decisions(plan: SequentialPlan, sims: int, seed: int) -> float:
    rng = random.Random(seed)
    wrong = 0
    for _ in range(sims):
        got, _ = simulate(plan, _cell(rng, 1.0, 0.2, plan.maximum), 1.0)
        wrong += got != UNDECIDED
    return wrong / sims


SIMS = 1500
MC = 3 * math.sqrt(0.05 * 0.95 / SIMS)  # three Monte Carlo standard errors


def test_error_rate_under_repeated_looks_is_within_alpha() -> None:
    # True speedup 1.0 and a decision threshold of 1.0 (the hardest case):
    # any stop is a false decision.
    rate = _false_decisions(SequentialPlan(first=5, batch=5, maximum=30, alpha=0.05), SIMS, 7)
    assert rate <= 0.05 + MC


def test_uncorrected_repeated_looks_would_exceed_alpha() -> None:
    # The same six looks at a plain 95% each: the simulation can tell the
    # difference, so the test above is not vacuous.
    class Naive(SequentialPlan):
        @property
        def confidence(self) -> float:
            return 0.95

    rate = _false_decisions(Naive(first=5, batch=5, maximum=30, alpha=0.05), SIMS, 7)
    assert rate > 0.05 + MC


# -- the runner's block loop (bench/until.py) on synthetic cells -------------------------


def _outcome(arm, sample: int, cost_ms: float, tokens: int = 20):
    from trtspec.bench.client import Job, Outcome

    job = Job(
        route="r",
        prompt_index=sample,
        sample_index=sample,
        item={},
        text_input="",
        max_tokens=tokens,
        arm=arm,
        temperature=0.0,
        top_p=1.0,
        top_k=0,
        seed=0,
        load="concurrency=1",
        concurrency=1,
        request_rate=None,
        warmup=False,
        request_id=f"{arm.label}-{sample}",
    )
    out = Outcome(job, send_ns=1_000_000, end_ns=1_000_000 + int(cost_ms * tokens * 1e6))
    out.final["completion_tokens"] = tokens
    return out


def test_run_block_stops_each_synthetic_cell_where_it_should() -> None:
    from trtspec.bench.client import Arm
    from trtspec.bench.until import Block, run_block

    base = Arm("baseline", "baseline")
    win = Arm("win", "win", "ngram", True, None, 4)
    loss = Arm("loss", "loss", "ngram", True, None, 2)
    null = Arm("null", "null", "lookahead", True)
    rng = random.Random(11)
    truth = {"win": 1.8, "loss": 0.6, "null": 1.0}
    sent: list[tuple[str, int]] = []
    block = Block()
    base_cost = {i: rng.uniform(20, 40) for i in range(40)}

    def send(arms, samples) -> None:
        for i in samples:
            for arm in arms:
                sent.append((arm.variant, i))
                if arm.variant == "baseline":
                    cost = base_cost[i]
                else:
                    noise = 0.002 if arm.variant == "null" else 0.05
                    cost = base_cost[i] / truth[arm.variant] * math.exp(rng.gauss(0, noise))
                block.record(_outcome(arm, i, cost))

    progress: list[tuple[int, int]] = []
    plan = SequentialPlan(first=5, batch=5, maximum=20)
    stops = {
        s.arm.variant: s
        for s in run_block(
            plan,
            [base, win, loss, null],
            1.05,
            send=send,
            block=block,
            stopped=lambda: False,
            on_batch=lambda n, d: progress.append((n, d)),
        )
    }
    assert (stops["win"].verdict, stops["win"].pairs) == (FASTER, 5)
    assert (stops["loss"].verdict, stops["loss"].pairs) == (SLOWER, 5)
    assert (stops["null"].verdict, stops["null"].pairs) == (UNDECIDED, 20)
    # decided arms stop getting requests; the baseline keeps pairing the rest
    assert max(i for v, i in sent if v == "win") == 4
    assert max(i for v, i in sent if v == "null") == 19
    assert max(i for v, i in sent if v == "baseline") == 19
    assert progress == [(5, 2), (5, 2), (5, 2), (5, 2)]
    assert stops["win"].as_dict("r", "concurrency=1", 0.0)["pairs_sent"] == 5


def test_run_block_stops_when_told() -> None:
    from trtspec.bench.client import Arm
    from trtspec.bench.until import Block, run_block

    calls = []
    stops = run_block(
        SequentialPlan(),
        [Arm("baseline", "baseline"), Arm("v", "v")],
        1.05,
        send=lambda arms, samples: calls.append(samples),
        block=Block(),
        stopped=lambda: bool(calls),
    )
    assert len(calls) == 1
    assert stops[0].verdict == UNDECIDED


# -- progress bars ------------------------------------------------------------------------


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_route_bars_draw_on_a_terminal() -> None:
    from trtspec.bench.progress import RouteBars

    stream = _Stream(tty=True)
    bars = RouteBars(stream)
    bars.route("code_completion concurrency=1 T=0", 30, 3)
    bars.update(5, 1)
    bars.update(5, 3)
    bars.finish_early()
    bars.close()
    text = stream.getvalue()
    assert "route=code_completion concurrency=1 T=0" in text
    assert "10/10" in text  # ended early: the bar's total shrinks to what was sent
    assert "decided 3/3" in text


def test_route_bars_are_silent_off_a_terminal() -> None:
    from trtspec.bench.progress import RouteBars

    stream = _Stream(tty=False)
    bars = RouteBars(stream)
    bars.route("chat_short", 30, 3)
    bars.update(5, 1)
    bars.close()
    assert stream.getvalue() == ""
