"""TensorRT-LLM versions: which ones trtspec speaks, how to read one, and
which Triton TensorRT-LLM container ships which (the version table behind
``stack.triton_image``'s default and the image/version mismatch warning,
read from triton-inference-server/server
``docs/introduction/compatibility.md`` ("Container Name: trtllm-python-py3";
the copy stored in July 2026 lists 24.04 to 26.07). Tags before 25.01 ship
TensorRT-LLM < 0.17, which trtspec refuses, so they are left out). Stdlib
only: the spec, the argv builders and the repository contract all read it.
"""

from __future__ import annotations

import re

#: The TensorRT-LLM versions trtspec speaks: MIN_TRTLLM <= (major, minor) < MAX_TRTLLM_EXCLUSIVE
#: (below 0.17 the examples layout and speculative flags differ; 1.3 removed the
#: engine flow). The spec refuses others; the repository contract assumes them.
MIN_TRTLLM = (0, 17)
MAX_TRTLLM_EXCLUSIVE = (1, 3)

IMAGE_REPOSITORY = "nvcr.io/nvidia/tritonserver"
IMAGE_SUFFIX = "-trtllm-python-py3"

# Container tag -> the TensorRT-LLM version it ships, as the table spells it.
IMAGE_TRTLLM: dict[str, str] = {
    "25.01": "0.17.0",
    "25.02": "0.17.0.post1",
    "25.03": "0.18.0",
    "25.04": "0.18.2",
    "25.05": "0.19.0",
    "25.06": "0.20.0",
    "25.07": "0.20.0",
    "25.08": "0.21.0",
    "25.09": "1.0.0",
    "25.10": "1.0.0",
    "25.11": "1.0.3.2510",
    "25.12": "1.1.0",
    "26.01": "1.1.0",
    "26.02": "1.1.0",
    "26.03": "1.2.0",
    "26.04": "1.2.1",
    "26.05": "1.2.1",
    "26.06": "1.2.1",
    "26.07": "1.2.1",
}


def _release(version: str) -> tuple[int, ...]:
    """``"1.0.3.2510"`` → ``(1, 0, 3)``; ``"0.17.0.post1"`` → ``(0, 17, 0)``."""
    m = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?", version.strip())
    return tuple(int(g or 0) for g in m.groups()) if m else ()


def image(tag: str) -> str:
    return f"{IMAGE_REPOSITORY}:{tag}{IMAGE_SUFFIX}"


def image_tag(image_ref: str) -> str:
    """``nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3`` → ``25.12``."""
    return image_ref.rsplit(":", 1)[-1].split("-", maxsplit=1)[0]


def image_for(trtllm_version: str) -> str | None:
    """The first (oldest) container that ships exactly ``trtllm_version``
    (major.minor.patch), else the newest one of the same major.minor; None when
    no container in the table ships that minor version. The oldest exact match
    keeps a pin's image stable as newer containers of the same release appear."""
    wanted = _release(trtllm_version)
    if not wanted:
        return None
    exact = [t for t, v in IMAGE_TRTLLM.items() if _release(v) == wanted]
    if exact:
        return image(min(exact))
    minor = [t for t, v in IMAGE_TRTLLM.items() if _release(v)[:2] == wanted[:2]]
    return image(max(minor)) if minor else None


def shipped_by(image_ref: str) -> str | None:
    """The TensorRT-LLM version ``image_ref``'s tag ships, if the table knows the tag."""
    return IMAGE_TRTLLM.get(image_tag(image_ref))


def parse_version(text: str) -> tuple[int, int, int] | None:
    """``"1.1.0"`` -> ``(1, 1, 0)`` (a missing patch reads 0); ``None`` if not a version."""
    m = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


#: Where the Triton TRT-LLM containers keep TensorRT-LLM's examples/ folder:
#: containers of TensorRT-LLM before 1.0 ship the TensorRT-LLM source tree at
#: ``/app/tensorrt_llm`` (triton-inference-server/tensorrtllm_backend
#: ``README.md`` at tag v0.19.0, c1e19638: ``cd /app/tensorrt_llm/examples/gpt``);
#: from 1.0 the examples sit at ``/app/examples`` (tutorials
#: ``Feature_Guide/Speculative_Decoding/TRT-LLM/README.md`` @00e95b90, see
#: shared/reference/trtllm-build.md §0).
EXAMPLES_DIR_BEFORE_1_0 = "/app/tensorrt_llm/examples"
EXAMPLES_DIR_FROM_1_0 = "/app/examples"


def default_examples_dir(trtllm_version: str) -> str:
    """The container's examples folder for ``trtllm_version`` (1.x layout when unparsable)."""
    ver = parse_version(trtllm_version)
    if ver is not None and ver[:2] < (1, 0):
        return EXAMPLES_DIR_BEFORE_1_0
    return EXAMPLES_DIR_FROM_1_0
