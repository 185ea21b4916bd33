"""The Dockerfile's text: NVIDIA's entrypoint stays in front of trtspec, no
build step imports tensorrt_llm (``docker build`` has no GPU), and the base
image is the spec's default Triton image."""

from __future__ import annotations

import json
import re
from pathlib import Path

from trtspec.spec.schema import DEFAULT_TRITON_IMAGE

DOCKERFILE = Path(__file__).resolve().parents[2] / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def test_entrypoint_keeps_nvidias_script_before_trtspec() -> None:
    entrypoints = [args for word, args in instructions() if word == "ENTRYPOINT"]
    assert entrypoints == ['["/opt/nvidia/nvidia_entrypoint.sh", "trtspec"]']
    assert json.loads(entrypoints[0]) == ["/opt/nvidia/nvidia_entrypoint.sh", "trtspec"]


def test_no_build_step_imports_tensorrt_llm() -> None:
    runs = [args for word, args in instructions() if word == "RUN"]
    assert runs
    for args in runs:
        assert not re.search(r"\b(import|from)\s+tensorrt_llm\b", args), args
    assert any("importlib.metadata" in args and "'tensorrt_llm'" in args for args in runs)


def test_base_image_is_the_default_triton_image() -> None:
    steps = instructions()
    assert steps[0] == ("ARG", f"TRITON_IMAGE={DEFAULT_TRITON_IMAGE}")
    assert steps[1] == ("FROM", "${TRITON_IMAGE}")


def test_the_image_runs_as_the_uid_the_pods_run_as() -> None:
    """`trtspec deploy k8s` pods set runAsNonRoot with uid 1000 (NGC Triton's
    triton-server user); both images end as that user, with the volumes theirs."""
    from trtspec.deploy.options import IMAGE_UID

    for name in ("Dockerfile", "Dockerfile.llmapi"):
        text = (DOCKERFILE.parent / name).read_text(encoding="utf-8")
        users = [ln.split()[1] for ln in text.splitlines() if ln.startswith("USER ")]
        assert users[-1:] == [f"{IMAGE_UID}:{IMAGE_UID}"], name
        assert f"chown {IMAGE_UID}:{IMAGE_UID} /models /work" in text, name
