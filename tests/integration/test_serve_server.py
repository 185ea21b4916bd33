"""``trtspec.serve.Server`` against the real tritonserver bundled in
nvidia-pytriton: explicit loading of one variant's closure, inference through
tritonclient, the repository API, metrics, the log file, failures that name the
broken model, deadlines, taken ports, and a teardown that leaves no server or
stub process. Server start-ups are few: one shared server for the happy path,
then one short-lived server per failure mode (most on an empty repository)."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tests.integration.conftest import ADD_ONE, BROKEN, SLOW_INIT, TIMES_TEN_VIA, ModelRepo
from trtspec.errors import ServerError
from trtspec.serve import Server, variant_models
from trtspec.serve.access import CLOSED_HEADER, CLOSED_VALUE

pytestmark = pytest.mark.slow


def _variant_repo(repo: ModelRepo) -> ModelRepo:
    """Variants `fast` (fast → add_one) and `baseline` (baseline → twice → add_one)."""
    repo.add_python_model("add_one", ADD_ONE)
    repo.add_python_model("fast", TIMES_TEN_VIA.format(callee="add_one"))
    repo.add_python_model("baseline", TIMES_TEN_VIA.format(callee="twice"))
    repo.add_python_model("twice", TIMES_TEN_VIA.format(callee="add_one"))
    repo.write_manifest(
        {
            "add_one": {"role": "engine", "calls": [], "variant": None, "mode": None},
            "twice": {"role": "engine", "calls": ["add_one"], "variant": None, "mode": None},
            "fast": {
                "role": "orchestrator",
                "calls": ["add_one"],
                "variant": "fast",
                "mode": "ngram",
            },
            "baseline": {
                "role": "orchestrator",
                "calls": ["twice"],
                "variant": "baseline",
                "mode": "none",
            },
        },
        ["fast", "baseline"],
    )
    return repo


@pytest.fixture(scope="module")
def served(triton_install, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("serve")
    repo = _variant_repo(ModelRepo(root / "repo"))
    server = Server(
        repo.path,
        install=triton_install,
        log_path=root / "logs" / "server.log",
        models=variant_models(repo.path, "fast"),
    )
    server.start(timeout=90)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def controlled(triton_install, served: Server, tmp_path_factory: pytest.TempPathFactory):
    """The same variant under control=True: explicit model control and a key
    on the command line — what tests that unload a model use, and what every
    server had before issue 28."""
    root = tmp_path_factory.mktemp("controlled")
    server = Server(
        served.repo,
        install=triton_install,
        log_path=root / "server.log",
        models=variant_models(served.repo, "fast"),
        control=True,
    )
    server.start(timeout=90)
    try:
        yield server
    finally:
        server.stop()


def _infer(url: str, model: str, values: list[int]) -> list[int]:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    tensor = grpcclient.InferInput("X", [len(values)], "INT32")
    tensor.set_data_from_numpy(np.array(values, dtype=np.int32))
    result = client.infer(model, [tensor])
    client.close()
    return result.as_numpy("Y").tolist()


def test_ready_on_loopback_with_picked_ports(served: Server) -> None:
    assert served.grpc_url == f"127.0.0.1:{served.grpc_port}"
    ports = {served.http_port, served.grpc_port, served.metrics_port}
    assert len(ports) == 3 and 0 not in ports
    assert served.http_url == f"127.0.0.1:{served.http_port}"
    with urllib.request.urlopen(f"http://{served.http_url}/v2/health/ready", timeout=5) as r:
        assert r.status == 200
    argv = Path(f"/proc/{served.pid}/cmdline").read_bytes().split(b"\0")
    assert b"--http-address=127.0.0.1" in argv and b"--grpc-address=127.0.0.1" in argv


def test_variant_closure_serves_through_bls(served: Server) -> None:
    # fast calls add_one over BLS: both must have been loaded explicitly.
    assert _infer(served.grpc_url, "fast", [1, 2, 3]) == [20, 30, 40]


def test_only_the_variant_closure_is_loaded(served: Server) -> None:
    # served from a view of exactly the closure, with model control off
    assert served.model_ready("fast") and served.model_ready("add_one")
    assert not served.model_ready("baseline") and not served.model_ready("twice")
    argv = Path(f"/proc/{served.pid}/cmdline").read_bytes().split(b"\0")
    assert f"--model-repository={served.view_dir}".encode() in argv
    assert not [a for a in argv if a.startswith((b"--model-control-mode", b"--load-model"))]
    assert sorted(p.name for p in served.view_dir.iterdir()) == ["add_one", "fast"]
    with pytest.raises(ServerError) as err:
        served.load_model("twice")
    assert "this server has no model control" in err.value.message


def test_load_and_unload_through_the_repository_api(controlled: Server) -> None:
    served = controlled
    served.load_model("twice")
    assert served.model_ready("twice")
    assert _infer(served.grpc_url, "twice", [0]) == [10]
    served.unload_model("twice")
    assert not served.model_ready("twice")
    with pytest.raises(ServerError) as err:
        served.load_model("no_such_model")
    assert err.value.message == (
        "loading model 'no_such_model' failed: failed to load 'no_such_model', failed to poll "
        "from model repository"
    )
    assert err.value.hint == f"log: {served.log_path}"


def test_metrics_are_prometheus_text(served: Server) -> None:
    text = served.metrics()
    assert 'nv_inference_request_success{model="fast",version="1"}' in text


def test_log_file_is_written(served: Server) -> None:
    assert served.log_path.parent.name == "logs"
    log = served.log_path.read_text()
    assert "successfully loaded 'fast'" in log and "successfully loaded 'add_one'" in log
    assert served.log_tail(3).splitlines() == log.splitlines()[-3:]


# The payload of D1: a Python model uploaded through the repository API with
# `file:` overrides; its initialize() leaves a marker proving it ran.
_UPLOADED = """\
import pathlib


class TritonPythonModel:
    def initialize(self, args):
        pathlib.Path({marker!r}).write_text("ran as the server's user")

    def execute(self, requests):
        return []
"""


def _upload_request(marker: Path) -> tuple[str, dict[str, bytes]]:
    config = json.dumps(
        {
            "name": "uploaded",
            "backend": "python",
            "max_batch_size": 0,
            "input": [{"name": "X", "data_type": "TYPE_INT32", "dims": [1]}],
            "output": [{"name": "Y", "data_type": "TYPE_INT32", "dims": [1]}],
        }
    )
    return config, {"file:1/model.py": _UPLOADED.format(marker=str(marker)).encode()}


def _http(served: Server, path: str, body: dict, headers: dict[str, str] | None = None):
    request = urllib.request.Request(
        f"http://{served.http_url}{path}",
        method="POST",
        data=json.dumps(body).encode(),
        headers=headers or {},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_restricted_apis_are_closed_to_every_client(
    served: Server, controlled: Server, tmp_path
) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    marker = tmp_path / "uploaded-model-ran"
    config, files = _upload_request(marker)
    body = {
        "parameters": {
            "config": config,
            **{k: base64.b64encode(v).decode() for k, v in files.items()},
        }
    }
    # HTTP: load with a file: override, and the repository index.
    assert _http(served, "/v2/repository/models/uploaded/load", body) == (
        403,
        '{"error":"This API is restricted, expecting header \'Trtspec-Closed\'"}',
    )
    assert _http(served, "/v2/repository/index", {}) == (
        403,
        '{"error":"This API is restricted, expecting header \'Trtspec-Closed\'"}',
    )
    wrong = {"Trtspec-Closed": "closed"}  # all of the value a header line can carry
    assert _http(served, "/v2/repository/models/uploaded/load", body, wrong)[0] == 403
    # gRPC: the same load, the index, and shared-memory registration.
    client = grpcclient.InferenceServerClient(served.grpc_url)
    refused = (
        "[StatusCode.UNAVAILABLE] This protocol is restricted, expecting header "
        "'triton-grpc-protocol-Trtspec-Closed'"
    )
    try:
        calls = [
            lambda: client.load_model("uploaded", config=config, files=files),
            client.get_model_repository_index,
            lambda: client.unload_model("fast"),
            lambda: client.register_system_shared_memory("r", "/trtspec_probe", 8),
        ]
        for call in calls:
            with pytest.raises(InferenceServerException) as err:
                call()
            assert str(err.value) == refused
        assert not marker.exists() and not served.model_ready("uploaded")
        assert served.model_ready("fast")
    finally:
        client.close()
    # With a control=True server's key the very same upload goes through: the
    # refusals above were the restriction, not a broken payload.
    client = grpcclient.InferenceServerClient(controlled.grpc_url)
    try:
        client.load_model(
            "uploaded", config=config, files=files, headers=controlled.admin_headers("grpc")
        )
        assert marker.read_text() == "ran as the server's user"
        client.unload_model("uploaded", headers=controlled.admin_headers("grpc"))
    finally:
        client.close()
    # The key is nowhere in the server log.
    assert controlled.admin_key is not None
    assert controlled.admin_key not in controlled.log_text()


PROBE = Path(__file__).resolve().parents[1] / "fixtures" / "admin_probe.py"


def _probe_as_nobody(server: Server, expect: str) -> dict:
    """Run tests/fixtures/admin_probe.py as user nobody against ``server``."""
    import shutil
    import subprocess
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="trtspec-probe-"))
    try:
        folder.chmod(0o755)
        script = folder / "probe.py"
        shutil.copy(PROBE, script)
        script.chmod(0o644)
        done = subprocess.run(
            [
                "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                "/usr/bin/python3", "-I", str(script), str(server.pid),
                str(server.http_port), str(server.grpc_port), "--expect", expect,
            ],
            check=False, capture_output=True, text=True, timeout=120, cwd=folder,
        )  # fmt: skip
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/usr/bin/python3").exists(),
    reason="running a probe as another user needs root (setpriv) and /usr/bin/python3",
)
def test_another_user_can_neither_use_a_key_nor_load_a_model(
    served: Server, controlled: Server
) -> None:
    """Issue 28: another local user reads the server's command line
    (/proc/PID/cmdline) and tries what it holds over HTTP/1.1 and raw HTTP/2.
    Against a trtspec server there is no key to find: the restricted APIs
    expect a value with a line feed, which no request can carry, and model
    control is off. Against a control=True server (the old policy) the very
    same probe reads the key and lists the repository: the probe works."""
    probe = _probe_as_nobody(served, expect="add_one")
    assert (probe["header"], probe["value"]) == (CLOSED_HEADER, CLOSED_VALUE)  # nothing to hide
    # 403: restricted; 400 or no answer at all (-1): the request did not parse
    for attempt in ("http_load", "http_load_raw", "http_index", "http_index_raw"):
        assert probe[attempt] in (400, 403, -1), (attempt, probe[attempt])
    assert probe["http_load"] == probe["http_index"] == 403
    assert not probe["grpc_index_with_value"]["listed"], probe["grpc_index_with_value"]
    assert not probe["grpc_index_lower_name"]["listed"], probe["grpc_index_lower_name"]
    assert not probe["grpc_index_no_key"]["listed"]
    assert not served.model_ready("probe")

    old = _probe_as_nobody(controlled, expect="add_one")
    assert old["value"] == controlled.admin_key  # the exposure issue 28 found
    assert old["http_index"] == 200
    assert old["grpc_index_with_value"]["listed"]
    assert not old["grpc_index_no_key"]["listed"]


def test_stop_is_clean_and_idempotent(served: Server, group_pids) -> None:
    # Runs last in this module: stops the shared server.
    pgid = served.pid
    assert pgid is not None
    assert len(group_pids(pgid)) >= 3  # the server and one stub per loaded model
    assert served.stop() == 0
    assert group_pids(pgid) == []
    assert served.stop() == 0
    assert "Traceback" not in served.log_text(), served.log_tail(40)


def test_broken_model_fails_start_naming_the_model(
    model_repo, triton_install, tmp_path, group_pids
) -> None:
    repo = model_repo("broken_repo")
    repo.add_python_model("add_one", ADD_ONE)
    repo.add_python_model("broken", BROKEN)
    log = tmp_path / "broken.log"
    server = Server(repo.path, install=triton_install, log_path=log)
    with pytest.raises(ServerError) as err:
        server.start(timeout=60)
    message = err.value.message
    assert message.startswith(
        "tritonserver exited with code 1 before it was ready\n"
        "errors in the log:\n"
        "  failed to load 'broken' version 1: Internal: RuntimeError: weights missing on purpose\n"
    ), message
    assert f"log tail ({log}):\n" in message
    assert err.value.hint == f"full log: {log}"
    assert group_pids(server.pid) == []
    assert not server.running


def test_start_deadline_stops_the_server(model_repo, triton_install, tmp_path, group_pids) -> None:
    repo = model_repo("slow_repo")
    repo.add_python_model("slow", SLOW_INIT)
    server = Server(repo.path, install=triton_install, log_path=tmp_path / "slow.log")
    with pytest.raises(ServerError) as err:
        server.start(timeout=1.5)
    assert err.value.message.startswith("tritonserver was not ready after 1.5 s\n")
    assert group_pids(server.pid) == []


def test_taken_explicit_port_is_reported(model_repo, triton_install, tmp_path) -> None:
    repo = model_repo("empty")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        server = Server(
            repo.path, install=triton_install, grpc_port=port, log_path=tmp_path / "busy.log"
        )
        with pytest.raises(ServerError) as err:
            server.start(timeout=60)
    assert err.value.message.startswith("tritonserver exited with code 1 before it was ready\n")
    assert f"127.0.0.1:{port}" in err.value.message and "already in use" in err.value.message
    assert err.value.hint == (
        "another process holds one of the ports; pick others with --http-port, --grpc-port and "
        f"--metrics-port (0 = any free port); full log: {tmp_path / 'busy.log'}"
    )


def test_picked_port_taken_meanwhile_is_repicked(
    model_repo, start_server, tmp_path, monkeypatch
) -> None:
    import trtspec.serve.supervisor as serve_module

    real = serve_module.free_ports
    calls: list[list[int]] = []
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()

        def racy(count: int, host: str = "127.0.0.1") -> list[int]:
            ports = real(count, host)
            if not calls:  # someone grabs the gRPC port between pick and bind
                ports[1] = busy.getsockname()[1]
            calls.append(ports)
            return ports

        monkeypatch.setattr(serve_module, "free_ports", racy)
        server = start_server(model_repo("empty").path, log_path=tmp_path / "race.log")
    assert len(calls) == 2
    assert server.grpc_port == calls[1][1] != calls[0][1]


def test_stop_after_sigkill_removes_the_shared_memory_left_behind(
    model_repo, start_server, tmp_path
) -> None:
    repo = model_repo("shm")
    repo.add_python_model("add_one", ADD_ONE)
    server = start_server(repo.path, log_path=tmp_path / "shm.log")
    prefix = server.shm_prefix
    assert prefix and _infer(server.grpc_url, "add_one", [1]) == [2]
    ours = sorted(p.name for p in Path("/dev/shm").iterdir() if p.name.startswith(prefix))
    assert ours, "the Python backend made no region under the server's prefix"
    os.killpg(server.pid, signal.SIGKILL)  # no graceful teardown: the regions stay behind
    deadline = time.monotonic() + 10
    while server.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all((Path("/dev/shm") / name).exists() for name in ours)
    server.stop()
    assert not [p for p in Path("/dev/shm").iterdir() if p.name.startswith(prefix)]


def test_check_alive_reports_a_dead_server(model_repo, start_server, tmp_path) -> None:
    server = start_server(model_repo("empty").path, log_path=tmp_path / "dead.log")
    server.check_alive()
    # Without model control the Server refuses to try, and says so.
    with pytest.raises(ServerError) as err:
        server.load_model("x")
    assert err.value.message == (
        "loading model 'x' failed: this server has no model control (trtspec serves a fixed "
        "set of models; a restart loads them again)"
    )
    assert err.value.hint == ("tests that must unload a model start the Server with control=True")
    os.kill(server.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while server.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(ServerError) as err:
        server.check_alive()
    assert err.value.message.startswith("tritonserver exited unexpectedly with code -9\n")
