"""``protocol.fast_byte_tensors``: the stub's BYTES serializer replaced by one
that answers exactly what the original (the wheel's own
``triton_python_backend_utils.py``, loaded from the installed pytriton) does."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import pytriton

from trtspec.runtime import models


def _real_utils() -> types.ModuleType:
    path = next(Path(pytriton.__file__).parent.rglob("triton_python_backend_utils.py"))
    return _load("real_pb_utils", path)


def _load(name: str, path: Path, monkeypatch: pytest.MonkeyPatch | None = None) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    if monkeypatch is not None:  # registered while it runs (dataclasses look it up)
        monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def protocol(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A private copy of ``protocol`` over a real copy of the stub's utils
    module (``sys.modules``' own entries are left as they were)."""
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", _real_utils())
    path = Path(models.__file__).parent / "protocol.py"
    return _load("protocol_under_test", path, monkeypatch)


CASES = [
    np.array([b"hello"], dtype=np.object_),
    np.array([b""], dtype=np.object_),
    np.array([b"ends in zeros\x00\x00"], dtype=np.object_),
    np.array(["caf\u00e9 \u2603".encode()], dtype=np.object_),
    np.array([[b"x" * 70000]], dtype=np.object_),  # [1, 1]: one element
    np.array(["a str, not bytes"], dtype=np.object_),  # the original's str path
    np.array([b"a", b"bc"], dtype=np.object_),  # several elements
    np.array([b"fixed", b"width"], dtype=np.bytes_),
    np.array([], dtype=np.object_),
    np.array([7], dtype=np.object_),  # str(7) in the original
]


@pytest.mark.parametrize("case", CASES, ids=range(len(CASES)))
def test_the_fast_serializer_answers_what_the_wheels_does(
    protocol: types.ModuleType, case: np.ndarray
) -> None:
    utils = sys.modules["triton_python_backend_utils"]
    original = _real_utils().serialize_byte_tensor
    assert getattr(utils.serialize_byte_tensor, "trtspec_fast", False)  # installed at import
    fast, slow = utils.serialize_byte_tensor(case), original(case)
    assert type(fast) is type(slow)
    assert fast == slow
    if isinstance(slow, bytes):  # and the original reads it back to the same values
        assert list(utils.deserialize_bytes_tensor(fast)) == list(
            original.__globals__["deserialize_bytes_tensor"](slow)
        )


def test_it_installs_once_and_never_where_the_function_is_missing(
    protocol: types.ModuleType,
) -> None:
    utils = sys.modules["triton_python_backend_utils"]
    installed = utils.serialize_byte_tensor
    assert protocol.fast_byte_tensors(utils) is False  # already there: not wrapped twice
    assert utils.serialize_byte_tensor is installed
    bare = types.ModuleType("bare")
    assert protocol.fast_byte_tensors(bare) is False
    assert not hasattr(bare, "serialize_byte_tensor")
