"""The Python models that do not compute (router, orchestrators, text models,
the router's in-process runner) and the instant engine import neither torch
nor transformers: each stub would pay seconds and hundreds of MB for them.
Imported in a fresh interpreter with a stand-in triton_python_backend_utils."""

from __future__ import annotations

import subprocess
import sys

import pytest

LIGHT = [
    "trtspec.runtime.models.router",
    "trtspec.runtime.models.orchestrator",
    "trtspec.runtime.models.preprocessing",
    "trtspec.runtime.models.postprocessing",
    "trtspec.runtime.models.inprocess",
    "trtspec.runtime.models.protocol",
    "trtspec.runtime.models.llmapi_adapter",
    "trtspec.runtime.engine.instant_model",
    "trtspec.runtime.engine.instant_llmapi",  # the LLM-API flow's instant LLM
    "trtspec.runtime.engine.triton_model",  # imports torch in initialize() only
]
PROBE = """
import importlib, sys, types
sys.modules["triton_python_backend_utils"] = types.ModuleType("triton_python_backend_utils")
importlib.import_module(sys.argv[1])
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"torch", "transformers"})
print(",".join(heavy))
"""


@pytest.mark.parametrize("module", LIGHT)
def test_light_models_import_neither_torch_nor_transformers(module: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, module],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"{module} imports {proc.stdout.strip()}"
