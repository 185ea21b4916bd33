"""The reference engine: real speculative decoding in torch behind TRT-LLM's tensor contract.

``ReferenceEngine.load(engine_dir)`` serves a reference engine folder (built by
``python -m trtspec.build.reference``) in process; ``triton_model.py`` serves
the same folder inside Triton's Python backend with the ``tensorrtllm``
backend's inputs and outputs. Heavy imports (torch, transformers) happen only
when an engine is loaded.
"""

from trtspec.runtime.engine.config import EngineConfig, EngineError, read_engine_config
from trtspec.runtime.engine.decode import (
    Generation,
    GenerationRequest,
    ReferenceEngine,
    RequestError,
    load_engine,
)
from trtspec.runtime.engine.sampling import SamplingParams

__all__ = [
    "EngineConfig",
    "EngineError",
    "Generation",
    "GenerationRequest",
    "ReferenceEngine",
    "RequestError",
    "SamplingParams",
    "load_engine",
    "read_engine_config",
]
