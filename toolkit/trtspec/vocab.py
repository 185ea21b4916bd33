"""The closed sets of names the spec, the planner and the TensorRT-LLM
command lines share: backends, model families, dtypes, quantizations. Stdlib
enums at ground level, so the argv builders need neither the spec nor the
mode modules (``trtspec.spec`` re-exports them). What a backend means
(``Backend.gpu``) is answered here, so no stage compares backend names."""

from __future__ import annotations

from enum import Enum


class Backend(str, Enum):
    tensorrt_llm = "tensorrt_llm"
    reference = "reference"

    @property
    def gpu(self) -> bool:
        """TensorRT-LLM on NVIDIA GPUs (the reference backend runs on the CPU):
        the one question every stage asks of a backend."""
        return self is Backend.tensorrt_llm


def gpu_backend(name: object) -> bool:
    """Whether a backend named in a file (a plan, a repository manifest, an
    engine's build record) is TensorRT-LLM's; an unknown or missing one is not."""
    try:
        return Backend(name).gpu
    except ValueError:
        return False


class Family(str, Enum):
    llama = "llama"
    mistral = "mistral"
    mixtral = "mixtral"
    qwen2 = "qwen2"


class DType(str, Enum):
    float16 = "float16"
    bfloat16 = "bfloat16"
    float32 = "float32"


class Quantization(str, Enum):
    none = "none"
    fp8 = "fp8"
    int8_sq = "int8_sq"
    int4_awq = "int4_awq"
    int8_wo = "int8_wo"
    int4_wo = "int4_wo"
    int8 = "int8"  # reference backend only: dynamic int8 on CPU
