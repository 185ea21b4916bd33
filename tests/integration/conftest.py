"""Shared fixtures for tests that run the real tritonserver.

- ``triton_install``: the ``TritonInstall`` ``trtspec.serve`` finds (skips the
  test where no tritonserver exists at all).
- ``model_repo``: a factory of small Triton repositories with Python-backend
  models written from source strings (configs built as ``ModelConfig``
  protobufs, as ``trtspec.repo`` does) and an optional ``trtspec-repo.json``.
- ``start_server``: starts a ``trtspec.serve.Server`` and always stops it at
  teardown.
- ``group_pids``: the live processes of a process group, read from /proc, to
  check that nothing a server started outlives it.
- ``every_mode_served``: a ``Shared`` handle (tests/conftest.py) on the
  every-mode repository of tests/fixtures/every_mode.py, served once for
  test_repo_served.py and test_requests_served.py.

Model sources for tests: ``ADD_ONE`` (``Y = X + 1``, INT32 [-1]), ``TIMES_TEN_VIA``
(a BLS model calling another model, then ``* 10``), ``BROKEN`` (fails in
``initialize``) and ``SLOW_INIT`` (sleeps in ``initialize``). Each model.py
imports ``triton_python_backend_utils`` first, which applies ``PYTHONPATH`` in
the stub that ``trtspec.serve`` sets up, and then imports ``trtspec``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.shared import Shared, shared

ADD_ONE = """\
import triton_python_backend_utils as pb_utils
import numpy as np

import trtspec  # proves the stub sees the package through PYTHONPATH


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            y = (x + 1).astype(np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        return responses
"""

TIMES_TEN_VIA = """\
import triton_python_backend_utils as pb_utils
import numpy as np

CALLEE = "{callee}"


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            call = pb_utils.InferenceRequest(
                model_name=CALLEE, requested_output_names=["Y"],
                inputs=[pb_utils.Tensor("X", x.as_numpy())],
            )
            result = call.exec()
            if result.has_error():
                raise pb_utils.TritonModelException(result.error().message())
            y = pb_utils.get_output_tensor_by_name(result, "Y").as_numpy()
            out = (y * 10).astype(np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", out)]))
        return responses
"""

BROKEN = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("weights missing on purpose")

    def execute(self, requests):
        return []
"""

SLOW_INIT = """\
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(60)

    def execute(self, requests):
        return []
"""


class ModelRepo:
    """A Triton model repository under construction in a temp folder."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)

    def add_python_model(
        self,
        name: str,
        source: str,
        *,
        inputs: Sequence[tuple[str, str, Sequence[int]]] = (("X", "TYPE_INT32", (-1,)),),
        outputs: Sequence[tuple[str, str, Sequence[int]]] = (("Y", "TYPE_INT32", (-1,)),),
        max_batch_size: int = 0,
        decoupled: bool = False,
        parameters: dict[str, str] | None = None,
    ) -> Path:
        """Write ``<name>/config.pbtxt`` (from a ``ModelConfig``) and
        ``<name>/1/model.py``; tensors are ``(name, "TYPE_…", dims)``."""
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2 as mc

        config = mc.ModelConfig(name=name, backend="python", max_batch_size=max_batch_size)
        for tensor_name, dtype, dims in inputs:
            config.input.add(name=tensor_name, data_type=mc.DataType.Value(dtype), dims=dims)
        for tensor_name, dtype, dims in outputs:
            config.output.add(name=tensor_name, data_type=mc.DataType.Value(dtype), dims=dims)
        config.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
        if decoupled:
            config.model_transaction_policy.decoupled = True
        for key, value in (parameters or {}).items():
            config.parameters[key].string_value = value
        folder = self.path / name
        (folder / "1").mkdir(parents=True, exist_ok=True)
        (folder / "config.pbtxt").write_text(text_format.MessageToString(config))
        (folder / "1" / "model.py").write_text(source)
        return folder

    def write_manifest(
        self,
        models: dict[str, dict[str, Any]],
        variants: Sequence[str],
        *,
        backend: str = "reference",
    ) -> Path:
        """Write ``trtspec-repo.json`` as docs/design/repository.md describes it."""
        manifest = {
            "schema_version": 1,
            "spec": self.path.name,
            "spec_hash": "0" * 16,
            "backend": backend,
            "trtllm_version": "1.1.0",
            "models": models,
            "variants": list(variants),
        }
        path = self.path / "trtspec-repo.json"
        path.write_text(json.dumps(manifest, indent=2))
        return path


@pytest.fixture(scope="session")
def triton_install() -> Any:
    from trtspec.errors import ServerError
    from trtspec.serve import find_tritonserver

    try:
        return find_tritonserver()
    except ServerError as exc:
        pytest.skip(f"no tritonserver here: {exc}")


@pytest.fixture
def model_repo(tmp_path: Path) -> Callable[[str], ModelRepo]:
    """``model_repo(name)`` → a fresh ``ModelRepo`` under ``tmp_path``."""
    return lambda name="repo": ModelRepo(tmp_path / name)


@pytest.fixture
def start_server(triton_install: Any) -> Iterator[Callable[..., Any]]:
    """``start_server(repo, **Server kwargs)`` → a started ``Server``; every
    server started through it is stopped at teardown."""
    from trtspec.serve import Server

    started: list[Server] = []

    def start(repo: Path, *, timeout: float = 60.0, **kwargs: Any) -> Server:
        server = Server(repo, install=triton_install, **kwargs)
        started.append(server)
        return server.start(timeout=timeout)

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def every_mode_served(
    tiny_llama: Path, tiny_draft: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Shared]:
    """``.get()`` → ``(server, spec, plan, repo)``; stopped after its last user."""
    from tests.fixtures.every_mode import serve_every_mode

    with shared(
        "every_mode_served",
        lambda: serve_every_mode(tiny_llama, tiny_draft, tmp_path_factory.mktemp("served")),
    ) as handle:
        yield handle


@pytest.fixture
def group_pids() -> Callable[[int], list[int]]:
    """``group_pids(pgid)`` → live (non-zombie) pids in that process group."""
    from trtspec.serve import group_members

    return group_members
