"""Every upstream-contract file under tests/data/ says where it comes from:
its header names the repository, at least one commit, and either the
release tag it was read at or, where the stored sources could not tie the
commit to a tag, a "Release: NOT resolved" line saying so."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1] / "data"
CONTRACTS = sorted(p.name for p in DATA.glob("*.txt"))


def header(path: Path) -> str:
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return "\n".join(lines)


@pytest.mark.parametrize("name", CONTRACTS)
def test_header_names_repository_commit_and_release(name: str) -> None:
    head = header(DATA / name)
    assert re.search(r"(NVIDIA/TensorRT-LLM|triton-inference-server/tensorrtllm_backend)", head)
    assert re.search(r"\b[0-9a-f]{8,40}\b", head), f"{name}: no commit in the header"
    tagged = re.search(r"\btags? v\d+\.\d+\.\d+", head)
    assert tagged or "Release: NOT resolved" in head, (
        f"{name}: name the release tag, or say 'Release: NOT resolved' and why"
    )


def test_the_handwritten_streams_say_so() -> None:
    streams = sorted((DATA / "sse_handwritten").glob("*.sse"))
    assert streams
    for path in streams:
        assert path.read_text(encoding="utf-8").startswith(": HAND-WRITTEN, not a recording"), path
