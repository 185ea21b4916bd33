"""``config.pbtxt`` as data: builders that return Triton ``ModelConfig``
protobuf messages (the ``model_config_pb2`` module shipped in tritonclient)
and the one reader/writer, which goes through ``google.protobuf.text_format``.
No config is ever produced from a string template, so no ``${…}`` placeholder
can reach disk; ``write_config`` refuses one anyway as a last guard.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from trtspec.fsutil import atomic_write_text
from trtspec.runtime.contract import TensorSpec
from trtspec.runtime.model_config import ModelConfig, read_config

__all__ = ["ModelConfig", "read_config"]  # read_config: the one reader, re-exported


def _fill_tensor(target: Any, spec: TensorSpec, *, is_input: bool) -> None:
    target.name = spec.name
    target.data_type = mc.DataType.Value(spec.data_type)
    target.dims.extend(spec.dims)
    if spec.scalar:
        # An empty reshape is meaningful (scalar per batch item); touching the
        # sub-message makes text_format emit ``reshape { }``.
        target.reshape.SetInParent()
    if is_input:
        if spec.optional:
            target.optional = True
        if spec.ragged:
            target.allow_ragged_batch = True


def add_tensors(config: Any, inputs: Iterable[TensorSpec], outputs: Iterable[TensorSpec]) -> None:
    for spec in inputs:
        _fill_tensor(config.input.add(), spec, is_input=True)
    for spec in outputs:
        _fill_tensor(config.output.add(), spec, is_input=False)


def set_parameters(config: Any, parameters: Mapping[str, object]) -> None:
    for key, value in parameters.items():
        if value is None:
            continue
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        config.parameters[key].string_value = text


def base_config(
    name: str,
    *,
    backend: str,
    max_batch_size: int,
    decoupled: bool,
    instances: int = 1,
    inputs: Sequence[TensorSpec] = (),
    outputs: Sequence[TensorSpec] = (),
    parameters: Mapping[str, object] | None = None,
    dynamic_batching: bool = False,
) -> Any:
    """A ``ModelConfig`` with the fields every trtspec model sets."""
    config = ModelConfig()
    config.name = name
    config.backend = backend
    config.max_batch_size = max_batch_size
    config.model_transaction_policy.decoupled = decoupled
    if dynamic_batching:
        batching = config.dynamic_batching
        batching.preferred_batch_size.append(max_batch_size)
        batching.max_queue_delay_microseconds = 0
        batching.default_queue_policy.max_queue_size = 0
    add_tensors(config, inputs, outputs)
    group = config.instance_group.add()
    group.count = instances
    group.kind = mc.ModelInstanceGroup.Kind.Value("KIND_CPU")
    set_parameters(config, parameters or {})
    return config


def parameters_of(config: Any) -> dict[str, str]:
    return {key: value.string_value for key, value in config.parameters.items()}


def to_text(config: Any) -> str:
    return text_format.MessageToString(config)


def write_config(path: Path, config: Any) -> None:
    """Write ``config`` as text protobuf, atomically."""
    text = to_text(config)
    if "${" in text:
        raise ValueError(f"{path}: an unfilled ${{…}} placeholder would reach disk")
    # Round-trip before writing so a malformed message never lands.
    text_format.Parse(text, ModelConfig())
    atomic_write_text(path, text)
