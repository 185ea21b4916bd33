"""trtspec's leader-mode ``mpirun`` argv against NVIDIA's launcher for the
1.x pins (tests/data/launch_triton_server_1.x.txt, read from
triton_backend/scripts/launch_triton_server.py; commit in its header): the
same prefix, one ``-n 1`` segment per rank separated by ``:``, ranks > 0
loading only the engine model(s) explicitly, and the per-rank
Python-backend shared-memory prefix, in upstream's order within each rank."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtspec.serve.launch import leader_mode_argv

DATA = Path(__file__).resolve().parents[1] / "data" / "launch_triton_server_1.x.txt"


def upstream() -> dict[str, list[str]]:
    parts = {}
    for line in DATA.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            name, tokens = line.split(":", 1)
            parts[name] = tokens.split() or [":"]
    return parts


def is_subsequence(want: list[str], got: list[str]) -> bool:
    it = iter(got)
    return all(token in it for token in want)


def split_ranks(argv: list[str], separator: str) -> list[list[str]]:
    ranks: list[list[str]] = [[]]
    for token in argv:
        if token == separator:
            ranks.append([])
        else:
            ranks[-1].append(token)
    return ranks


@pytest.mark.parametrize("oversubscribe", [False, True])
@pytest.mark.parametrize("engines", [["target"], ["draft_x", "target_dte"]])
@pytest.mark.parametrize("world_size", [2, 4])
def test_leader_mode_follows_the_upstream_launcher(
    world_size: int, engines: list[str], oversubscribe: bool
) -> None:
    parts = upstream()
    argv = leader_mode_argv(
        world_size,
        "/repo",
        engine_model=engines,
        binary="/opt/tritonserver/bin/tritonserver",
        oversubscribe=oversubscribe,
    )
    prefix = parts["prefix_oversubscribe" if oversubscribe else "prefix"]
    assert argv[: len(prefix)] == prefix
    ranks = split_ranks(argv[len(prefix) :], parts["separator"][0])
    assert len(ranks) == world_size
    for rank, segment in enumerate(ranks):
        fill = {"binary": "/opt/tritonserver/bin/tritonserver", "repo": "/repo", "rank": rank}
        head = [t.format(**fill) for t in parts["rank_head"]]
        assert segment[: len(head)] == head, segment
        nonzero = []
        if rank:
            nonzero = [parts["rank_nonzero"][0]] + [
                parts["rank_nonzero"][1].format(engine=e) for e in engines
            ]
        tail = [t.format(**fill) for t in parts["rank_tail"]]
        assert is_subsequence(head + nonzero + tail, segment), (rank, segment)
        if not rank:
            assert not any(t.startswith("--model-control-mode") for t in segment), segment
        ports = [t for t in segment if t.startswith(("--grpc-port", "--http-port", "--metrics"))]
        assert len(ports) == len({p.split("=")[0] for p in ports}), segment


def test_the_check_can_fail() -> None:
    parts = upstream()
    tail = [t.format(rank=1) for t in parts["rank_tail"]]
    assert not is_subsequence(tail, ["--backend-config=python,shm-region-prefix-name=prefix0_"])
    assert is_subsequence(["a", "c"], ["a", "b", "c"]) and not is_subsequence(
        ["c", "a"], ["a", "c"]
    )
