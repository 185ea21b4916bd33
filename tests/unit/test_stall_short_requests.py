"""benchmarks/stall_short_requests.py's count: a ceiling run that ends with
failed requests and no incident froze (its requests waited out ceiling.py's
response wait), even though ceiling.py exited 0."""

from __future__ import annotations

from tests.fixtures.benchmarks import benchmark_module

stall = benchmark_module("stall_short_requests")

FROZEN = """step 8 ms stream_interval 1: server ready in 2.1 s
  engine x16: 575 tok/s
  full x16: 4 tok/s
    16 failed, the first: stream: no response for 60 s
"""
CLEAN = """step 8 ms stream_interval 1: server ready in 2.1 s
  engine x16: 575 tok/s
  full x16: 216 tok/s
"""
RECOVERED = FROZEN + "incident: stub_frozen router_0_0 (restarted)\n"


def test_a_run_with_failed_requests_and_no_incident_froze() -> None:
    finished, line = stall.outcome(True, FROZEN)
    assert finished is False
    assert line == "full x16: 4 tok/s  [froze: 16 failed, the first: stream: no response for 60 s]"


def test_a_clean_run_ran_through() -> None:
    assert stall.outcome(True, CLEAN) == (True, "full x16: 216 tok/s")


def test_a_frozen_router_the_watchdog_restarted_is_a_recovered_trial() -> None:
    finished, line = stall.outcome(True, RECOVERED)
    assert finished is True
    assert line.endswith("[1 incident(s): incident: stub_frozen router_0_0 (restarted)]")


def test_a_run_that_did_not_end_stalled() -> None:
    assert stall.outcome(False, "") == (False, "")
