"""The router honours a route's ``max_concurrency`` through the real tritonserver.

Two echo orchestrators (``baseline`` and ``ngram``, paced so a request lasts
about two seconds) sit behind the real ``router`` model with a routing table
limiting route ``code`` to two in-flight requests on ``ngram``. Six requests
sent together: two are served by ``ngram``, the rest by the fallback, and
once they are done a new request goes to ``ngram`` again (its places were
freed). Route ``chat`` has no limit and is never redirected.
"""

from __future__ import annotations

import threading

import pytest

from tests.fixtures.router_jobs import add_router
from trtspec.bench.client import Arm, Job, StreamWorker
from trtspec.bench.echo_model import write_echo_repository

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    from trtspec.serve import Server

    root = tmp_path_factory.mktemp("router-limit")
    repo = write_echo_repository(
        root / "repo", {"baseline": {"round_ms": 50.0}, "ngram": {"round_ms": 50.0}}
    )
    add_router(
        repo,
        ["baseline", "ngram"],
        {"code": {"variant": "ngram", "max_concurrency": 2}, "chat": {"variant": "ngram"}},
    )
    with Server(repo, log_path=root / "server.log") as srv:
        yield srv
    assert "Traceback" not in srv.log_text(), srv.log_tail(60)


def _send(url: str, route: str, i: int) -> str | None:
    arm = Arm(variant="router", model="router")
    job = Job(
        route=route,
        prompt_index=0,
        sample_index=i,
        item={},
        text_input="abcdefghijklmnopqrstuvwxyz0123456789",
        max_tokens=36,
        arm=arm,
        temperature=0.0,
        top_p=1.0,
        top_k=0,
        seed=i,
        load="c6",
        concurrency=6,
        request_rate=None,
        warmup=False,
        request_id=f"{route}-{i}",
    )
    worker = StreamWorker(url, 120)
    try:
        outcome = worker.run(job)
    finally:
        worker.close()
    assert outcome.error is None, outcome.error
    return outcome.final.get("variant")


def _together(url: str, route: str, n: int) -> list[str | None]:
    served: list[str | None] = [None] * n
    start = threading.Barrier(n)

    def work(i: int) -> None:
        start.wait()
        served[i] = _send(url, route, i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    return served


def test_route_over_its_limit_goes_to_the_fallback(server) -> None:
    served = _together(server.grpc_url, "code", 6)
    assert served.count("ngram") == 2, served
    assert served.count("baseline") == 4, served
    assert _send(server.grpc_url, "code", 99) == "ngram"  # the places were freed


def test_route_without_a_limit_is_never_redirected(server) -> None:
    assert set(_together(server.grpc_url, "chat", 6)) == {"ngram"}
