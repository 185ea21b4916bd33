"""``trtspec serve`` as a real subprocess: endpoints on stdout once ready, the
variant's models served, and after SIGINT (or a SIGKILL of the CLI itself) no
tritonserver or stub process it started is left."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.integration.conftest import ADD_ONE, SLOW_INIT, TIMES_TEN_VIA
from trtspec.serve.access import root_warning

pytestmark = pytest.mark.slow


def _launch(args: list[str], tmp_path: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "trtspec.cli.main", "serve", *args]
    with open(tmp_path / "cli.err", "wb") as stderr:
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr)


def _read_json(process: subprocess.Popen[bytes], tmp_path: Path, timeout: float = 90) -> dict:
    """Read stdout until one JSON document is complete, with a deadline (raw
    reads: a buffered reader would hide lines from the selector)."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    selector = selectors.DefaultSelector()
    selector.register(fd, selectors.EVENT_READ)
    data = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if selector.select(timeout=0.5):
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            data += chunk
            if data.rstrip().endswith(b"}"):
                selector.close()
                return json.loads(data)
        elif process.poll() is not None:
            break
    selector.close()
    process.kill()
    process.wait()
    pytest.fail(
        f"no endpoints from trtspec serve; stdout={data!r}\n"
        f"stderr={(tmp_path / 'cli.err').read_text()}"
    )


def _repo(model_repo) -> Path:
    repo = model_repo("cli_repo")
    repo.add_python_model("add_one", ADD_ONE)
    repo.add_python_model("fast", TIMES_TEN_VIA.format(callee="add_one"))
    repo.add_python_model("other", ADD_ONE)
    repo.write_manifest(
        {
            "add_one": {"role": "engine", "calls": [], "variant": None, "mode": None},
            "fast": {
                "role": "orchestrator",
                "calls": ["add_one"],
                "variant": "fast",
                "mode": "ngram",
            },
            "other": {"role": "orchestrator", "calls": [], "variant": "baseline", "mode": "none"},
        },
        ["fast", "baseline"],
    )
    return repo.path


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_sigint_stops_server_and_stubs(model_repo, tmp_path, group_pids, triton_install) -> None:
    log = tmp_path / "serve.log"
    process = _launch(
        [
            str(_repo(model_repo)),
            "--variant",
            "fast",
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            "--metrics-port",
            "0",
            "--log-file",
            str(log),
            "--format",
            "json",
        ],
        tmp_path,
    )
    try:
        info = _read_json(process, tmp_path)
        assert info["models"] == ["add_one", "fast"]
        assert info["log"] == str(log) and info["world_size"] == 1
        assert info["grpc"].startswith("127.0.0.1:")
        assert _status(f"{info['http']}/v2/health/ready") == 200
        assert _status(f"{info['http']}/v2/models/fast/ready") == 200
        assert _status(f"{info['http']}/v2/models/other/ready") == 400  # not in the variant
        pgid = _server_pgid(process.pid)
        assert pgid, "trtspec serve started no tritonserver"
        assert len(group_pids(pgid)) >= 3  # the server and a stub per loaded model
        process.send_signal(signal.SIGINT)
        rc = process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()
    stderr = (tmp_path / "cli.err").read_text()
    assert rc == 0, stderr
    assert stderr.endswith("Ready. Press Ctrl-C to stop.\nStopping tritonserver…\nStopped.\n")
    assert group_pids(pgid) == []
    assert "Traceback" not in log.read_text()


def test_sigkill_of_the_cli_still_takes_the_server_down(
    model_repo, tmp_path, group_pids, triton_install
) -> None:
    repo = model_repo("solo")
    repo.add_python_model("add_one", ADD_ONE)
    process = _launch(
        [
            str(repo.path),
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            "--metrics-port",
            "0",
            "--format",
            "json",
        ],
        tmp_path,
    )
    try:
        _read_json(process, tmp_path)
        pgid = _server_pgid(process.pid)
        assert pgid and group_pids(pgid)
    finally:
        process.kill()
        process.wait(timeout=10)
        process.stdout.close()
    deadline = time.monotonic() + 30
    while group_pids(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert group_pids(pgid) == []


def test_sigint_while_starting_stops_everything(
    model_repo, tmp_path, group_pids, triton_install
) -> None:
    repo = model_repo("slow")
    repo.add_python_model("slow", SLOW_INIT)
    process = _launch(
        [str(repo.path), "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"], tmp_path
    )
    try:
        deadline = time.monotonic() + 30
        pgid = None
        while pgid is None and time.monotonic() < deadline:
            pgid = _server_pgid(process.pid)
            time.sleep(0.1)
        assert pgid, (tmp_path / "cli.err").read_text()
        while len(group_pids(pgid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)  # the stub is up and sleeping in initialize()
        process.send_signal(signal.SIGINT)
        rc = process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()
    stderr = (tmp_path / "cli.err").read_text()
    assert rc == 130, stderr
    assert stderr.endswith("\nInterrupted.\n")
    assert group_pids(pgid) == []


def test_server_dying_ends_the_cli_with_the_log_tail(
    model_repo, tmp_path, group_pids, triton_install
) -> None:
    repo = model_repo("dies")
    repo.add_python_model("add_one", ADD_ONE)
    log = tmp_path / "dies.log"
    process = _launch(
        [
            str(repo.path),
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            "--metrics-port",
            "0",
            "--log-file",
            str(log),
        ],
        tmp_path,
    )
    try:
        _read_table(process, tmp_path)
        pgid = _server_pgid(process.pid)
        assert pgid
        os.kill(pgid, signal.SIGKILL)  # the tritonserver process itself
        rc = process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()
    stderr = (tmp_path / "cli.err").read_text()
    assert rc == 1, stderr
    assert "Error: tritonserver exited unexpectedly with code -9\n" in stderr
    assert f"log tail ({log}):\n" in stderr and stderr.endswith(f"Hint: full log: {log}\n")
    assert group_pids(pgid) == []  # its stubs went with it


def test_a_crashed_stub_is_restarted_and_reported(model_repo, tmp_path, triton_install) -> None:
    """`trtspec serve` runs the stub watchdog: a stub killed by SIGSEGV is
    reported on stderr within seconds and the model answers again on the same
    port."""
    from trtspec.serve import stubs_of

    repo = model_repo("crashes")
    repo.add_python_model("add_one", ADD_ONE)
    process = _launch(
        [
            str(repo.path),
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            "--metrics-port",
            "0",
            "--format",
            "json",
        ],
        tmp_path,
    )
    try:
        info = _read_json(process, tmp_path)
        stub = next(s for s in stubs_of(info["pid"]).values() if s.model == "add_one")
        os.kill(stub.pid, signal.SIGSEGV)
        expected = (
            f"Error: the Python-backend stub of model 'add_one' (pid {stub.pid}) was "
            "killed by SIGSEGV; the requests in flight failed; tritonserver restarted "
            "on the same ports in "
        )
        deadline = time.monotonic() + 200
        while (
            expected not in (tmp_path / "cli.err").read_text()
            and time.monotonic() < deadline
            and process.poll() is None
        ):
            time.sleep(0.2)
        assert expected in (tmp_path / "cli.err").read_text()
        assert _status(f"{info['http']}/v2/models/add_one/ready") == 200
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()


def _read_table(process: subprocess.Popen[bytes], tmp_path: Path, timeout: float = 90) -> str:
    """Read stdout until the endpoint table's last row (the log) has arrived."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    data = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while time.monotonic() < deadline and b"\nlog " not in data:
            if selector.select(timeout=0.5):
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                data += chunk
            elif process.poll() is not None:
                break
    if b"\nlog " not in data:
        pytest.fail(f"no endpoint table; stdout={data!r}\n{(tmp_path / 'cli.err').read_text()}")
    return data.decode()


def _server_pgid(cli_pid: int) -> int | None:
    """The tritonserver child of the CLI process leads its own group."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[1]) == cli_pid and "(tritonserver)" in stat:
                return int(fields[2])
    return None


def test_table_output_and_sigterm_in_process(
    model_repo, tmp_path, triton_install, monkeypatch
) -> None:
    from click.testing import CliRunner

    import trtspec.cli.serve as serve_cli
    from trtspec.cli.main import cli
    from trtspec.serve import free_ports

    repo = model_repo("table")
    repo.add_python_model("add_one", ADD_ONE)
    http, grpc, metrics = free_ports(3)
    log = tmp_path / "table.log"
    ready = threading.Event()
    sent: list[bool] = []
    real_progress = serve_cli.progress

    def progress(message: str) -> None:
        real_progress(message)
        if message.startswith("Ready."):
            ready.set()

    monkeypatch.setattr(serve_cli, "progress", progress)

    def stop_when_ready() -> None:
        # "Ready." is printed inside the command, with its SIGTERM handler
        # installed, so the signal reaches that handler and not pytest.
        if ready.wait(timeout=60):
            os.kill(os.getpid(), signal.SIGTERM)
            sent.append(True)

    watcher = threading.Thread(target=stop_when_ready, daemon=True)
    watcher.start()
    result = CliRunner().invoke(
        cli,
        [
            "serve",
            str(repo.path),
            "--http-port",
            str(http),
            "--grpc-port",
            str(grpc),
            "--metrics-port",
            str(metrics),
            "--log-file",
            str(log),
        ],
    )
    watcher.join(timeout=5)
    assert sent == [True]
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "endpoint  address",
        "--------  " + "-" * max(len(str(log)), len(f"http://127.0.0.1:{metrics}/metrics")),
        f"http      http://127.0.0.1:{http}",
        f"grpc      127.0.0.1:{grpc}",
        f"metrics   http://127.0.0.1:{metrics}/metrics",
        f"log       {log}",
    ]
    root = root_warning()  # as root, said first (issue 28)
    assert result.stderr == (
        (f"{root}\n" if root else "") + f"Starting tritonserver (nvidia-pytriton); log: {log}\n"
        "Ready. Press Ctrl-C to stop.\nStopping tritonserver…\nStopped.\n"
    )
    assert _status_or_none(f"http://127.0.0.1:{http}/v2/health/ready") is None


def _status_or_none(url: str) -> int | None:
    try:
        return _status(url)
    except OSError:
        return None
