"""``trtllm-serve`` per variant (``trtspec.flows.llmapi_serve``) against a
stand-in executable that takes trtllm-serve's argv (it cannot run here):
every server healthy before ``start`` returns, one that exits early fails
with its log tail, ``stop`` leaves no process, and the bench entries pair each
variant with the baseline server."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from trtspec.cli.main import cli
from trtspec.errors import ServerError
from trtspec.flows.llmapi_serve import TrtllmServeFleet
from trtspec.procutil import pid_alive

FAKE = f"""#!{sys.executable}
import argparse, http.server, sys
p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("--host"); p.add_argument("--port", type=int)
p.add_argument("--backend"); p.add_argument("--extra_llm_api_options")
a = p.parse_args()
if "broken" in open(a.extra_llm_api_options).read():
    print("ValueError: max_draft_len must be > 0 for NGram", flush=True)
    sys.exit(3)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer((a.host, a.port), H).serve_forever()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _commands(tmp_path: Path, texts: dict[str, str]) -> dict[str, list[str]]:
    out = {}
    for name, text in texts.items():
        config = tmp_path / f"{name}.yaml"
        config.write_text(text)
        out[name] = [
            "trtllm-serve", "/models/m", "--host", "127.0.0.1", "--port", str(_free_port()),
            "--backend", "pytorch", "--extra_llm_api_options", str(config),
        ]  # fmt: skip
    return out


@pytest.fixture
def fake(tmp_path: Path) -> str:
    path = tmp_path / "trtllm-serve"
    path.write_text(FAKE)
    path.chmod(0o755)
    return str(path)


def test_every_server_is_healthy_then_stopped(tmp_path: Path, fake: str) -> None:
    commands = _commands(tmp_path, {"baseline": "model: m\n", "ngram": "model: m\n"})
    with TrtllmServeFleet(commands, tmp_path / "logs", binary=fake) as fleet:
        fleet.start(timeout_s=60)
        pids = [m.proc.pid for m in fleet.members if m.proc]
        assert all(pid_alive(p) for p in pids)
        arms = fleet.external_arms("org/model")
        port = commands["ngram"][commands["ngram"].index("--port") + 1]
        assert arms["ngram"] == {
            "openai": f"http://127.0.0.1:{port}",
            "model": "org/model",
            "baseline": "baseline",
            "metrics": f"http://127.0.0.1:{port}/prometheus/metrics",
        }
        assert "baseline" not in arms["baseline"]
    assert not any(pid_alive(p) for p in pids)


def test_a_server_that_exits_fails_the_start_with_its_log(tmp_path: Path, fake: str) -> None:
    commands = _commands(tmp_path, {"baseline": "model: m\n", "ngram": "broken: true\n"})
    fleet = TrtllmServeFleet(commands, tmp_path / "logs", binary=fake)
    with pytest.raises(ServerError) as info:
        fleet.start(timeout_s=60)
    assert "trtllm-serve for variant ngram exited 3 before it was ready" in info.value.message
    assert "max_draft_len must be > 0 for NGram" in info.value.message
    assert not any(m.proc and m.proc.poll() is None for m in fleet.members)


def test_serve_llmapi_needs_the_built_files(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "g", "flow": "llmapi", "target": {"model": "org/m", "family": "llama"},
    }))  # fmt: skip
    result = CliRunner().invoke(cli, ["serve-llmapi", str(spec), "--engines", str(tmp_path)])
    assert result.exit_code == 2
    assert f"{tmp_path / 'g' / 'llmapi' / 'baseline.yaml'} not found: run `trtspec build" in (
        result.stderr
    )


def test_serve_llmapi_warns_before_it_widens_the_bind(tmp_path: Path, fake: str) -> None:
    """Anything but loopback prints what trtllm-serve exposes, before any
    server starts (here the stand-in refuses its file, so nothing listens)."""
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "g", "flow": "llmapi", "target": {"model": "org/m", "family": "llama"},
    }))  # fmt: skip
    files = tmp_path / "engines" / "g" / "llmapi"
    files.mkdir(parents=True)
    (files / "baseline.yaml").write_text("broken: true\n")
    argv = [
        "serve-llmapi", str(spec), "--engines", str(tmp_path / "engines"),
        "--trtllm-serve", fake, "--log-dir", str(tmp_path / "logs"), "--base-port", "18100",
    ]  # fmt: skip
    widened = CliRunner().invoke(cli, [*argv, "--host", "0.0.0.0"])
    assert widened.exit_code == 1, widened.output
    assert (
        "Warning: --host 0.0.0.0 is not a loopback address. Anyone who can reach this machine "
        "can, without authentication or TLS, run inference through trtllm-serve's "
        "OpenAI-compatible API and read its health and metrics (HTTP on 18100)."
    ) in " ".join(widened.stderr.split())
    assert "exited 3 before it was ready" in widened.stderr
    loopback = CliRunner().invoke(cli, argv)
    assert loopback.exit_code == 1, loopback.output
    assert "Warning" not in loopback.stderr
