"""The Triton container ↔ TensorRT-LLM version table (``trtspec.versions``,
from triton-inference-server/server ``docs/introduction/compatibility.md``)
and the GPU guide's table (docs/guide/gpu.md), which must say the same."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trtspec.spec.schema import DEFAULT_TRITON_IMAGE, DEFAULT_TRTLLM_VERSION
from trtspec.versions import IMAGE_TRTLLM, image, image_for, image_tag, shipped_by

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "gpu.md"


def test_table_rows_read_from_the_compatibility_matrix() -> None:
    # Spot checks of the source rows the issue names: 25.12-26.02 ship 1.1.0,
    # 26.04-26.07 ship 1.2.1 (26.03 ships 1.2.0).
    assert [IMAGE_TRTLLM[t] for t in ("25.12", "26.01", "26.02")] == ["1.1.0"] * 3
    assert IMAGE_TRTLLM["26.03"] == "1.2.0"
    assert [IMAGE_TRTLLM[t] for t in ("26.04", "26.05", "26.06", "26.07")] == ["1.2.1"] * 4
    assert list(IMAGE_TRTLLM) == sorted(IMAGE_TRTLLM)


def test_default_image_is_the_table_pick_for_the_default_version() -> None:
    assert image_for(DEFAULT_TRTLLM_VERSION) == DEFAULT_TRITON_IMAGE


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("1.0.3", "25.11"),
        ("0.17.0", "25.01"),
        ("0.19.3", "25.05"),
        ("1.3.0", None),
        ("0.16.0", None),
        ("x", None),
    ],
)
def test_image_for(version: str, expected: str | None) -> None:
    assert image_for(version) == (image(expected) if expected else None)


def test_tags_and_shipped_versions() -> None:
    assert image_tag(DEFAULT_TRITON_IMAGE) == "25.12"
    assert shipped_by("nvcr.io/nvidia/tritonserver:26.05-trtllm-python-py3") == "1.2.1"
    assert shipped_by("my/own:latest") is None


def test_guide_version_table_matches_the_module() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    table = text.split("<!-- version-table:start -->")[1].split("<!-- version-table:end -->")[0]
    rows = [r for r in table.strip().splitlines()[2:]]
    assert rows
    for row in rows:
        version, default, others = (c.strip() for c in row.strip("|").split("|"))
        tags = [t for t, v in IMAGE_TRTLLM.items() if v == version]
        assert default == f"`{image_for(version)}`", row
        listed = [] if others == "—" else re.split(r",\s*", others)
        assert [image_tag(default.strip("`")), *listed] == tags, row
