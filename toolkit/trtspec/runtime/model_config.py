"""A model's ``config.pbtxt`` read back as Triton's ``ModelConfig`` protobuf
message (the ``model_config_pb2`` module shipped in tritonclient), through
``google.protobuf.text_format``. The one reader: the router's in-process
variants read their siblings' configs with it inside tritonserver, and
``trtspec.repo.configs`` (which builds and writes the configs) re-exports it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

ModelConfig = mc.ModelConfig


def read_config(path: Path) -> Any:
    """Parse ``path`` as a ``ModelConfig``; raises ``text_format.ParseError``."""
    return text_format.Parse(path.read_text(encoding="utf-8"), ModelConfig())
