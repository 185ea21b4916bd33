"""``trtspec serve`` through Click's CliRunner: the errors a user meets before
any server starts (exit 1, ``Error:``/``Hint:`` on stderr, nothing on stdout)
and usage errors (exit 2). The running command is tested as a real
subprocess in tests/integration/test_serve_cli.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

from click.testing import CliRunner

from trtspec.cli.main import cli
from trtspec.serve.access import root_warning


def _run(*args: str):
    return CliRunner().invoke(cli, ["serve", *args])


def _manifest(repo: Path) -> Path:
    repo.mkdir()
    path = repo / "trtspec-repo.json"
    path.write_text(
        json.dumps(
            {
                "schema_version": 1,
                "spec": "s",
                "backend": "reference",
                "models": {
                    "baseline": {"role": "orchestrator", "variant": "baseline", "calls": []},
                    "ngram": {"role": "orchestrator", "variant": "ngram", "calls": []},
                },
                "variants": ["ngram", "baseline"],
            }
        )
    )
    return path


def test_unknown_variant(tmp_path: Path) -> None:
    path = _manifest(tmp_path / "repo")
    result = _run(str(tmp_path / "repo"), "--variant", "medusa")
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    assert result.stderr == (
        f"Error: {path}: unknown variant 'medusa'; valid variants: ngram, baseline\n"
        "Hint: pass one of the valid variants to --variant\n"
    )


def test_missing_repository(tmp_path: Path) -> None:
    for extra in ([], ["--variant", "ngram"]):
        result = _run(str(tmp_path / "nope"), *extra)
        assert result.exit_code == 1, result.output
        assert result.stdout == ""
        assert result.stderr == (
            f"Error: model repository not found: {tmp_path / 'nope'}\n"
            "Hint: pass the folder `trtspec repo` wrote (e.g. triton_repo/<spec>)\n"
        )


def test_variant_without_manifest(tmp_path: Path) -> None:
    result = _run(str(tmp_path), "--variant", "ngram")
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        f"Error: {tmp_path / 'trtspec-repo.json'}: not found; --variant needs the manifest "
        "that `trtspec repo` writes\n"
        "Hint: serve the folder `trtspec repo` wrote, or leave out --variant to load all models\n"
    )


def test_missing_tritonserver_binary(tmp_path: Path) -> None:
    result = _run(str(tmp_path), "--tritonserver", str(tmp_path / "ts"))
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    assert result.stderr == (
        f"Error: tritonserver binary not found: {tmp_path / 'ts'}\n"
        "Hint: pass the path of an executable tritonserver, or leave it out to search PATH, "
        "/opt/tritonserver/bin and the nvidia-pytriton wheel\n"
    )


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    result = _run(str(tmp_path), "--grpc-port", "70000")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "Invalid value for '--grpc-port': 70000 is not in the range 0<=x<=65535." in (
        result.stderr
    )
    result = _run(str(tmp_path), "--timeout", "0")
    assert result.exit_code == 2
    assert "Invalid value for '--timeout'" in result.stderr


def test_help_lists_the_options() -> None:
    result = CliRunner().invoke(cli, ["serve", "--help"])
    assert result.exit_code == 0
    for option in (
        "--variant",
        "--host",
        "--http-port",
        "--grpc-port",
        "--metrics-port",
        "--tritonserver",
        "--log-file",
        "--timeout",
        "--world-size",
        "--format",
    ):
        assert option in result.stdout


def test_non_loopback_host_warns_what_it_exposes(tmp_path: Path) -> None:
    # /bin/false stands in for tritonserver: the warning comes before the start.
    result = _run(
        str(tmp_path),
        "--host",
        "0.0.0.0",
        "--tritonserver",
        "/bin/false",
        "--http-port",
        "18000",
        "--grpc-port",
        "0",
        "--metrics-port",
        "18002",
    )
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines()[0] == (
        "Warning: --host 0.0.0.0 is not a loopback address. Anyone who can reach this machine "
        "can, without authentication or TLS: run inference and read health, metadata, model "
        "configurations and statistics (HTTP on 18000, gRPC on a free port), and read the "
        "metrics (on 18002). No model can be loaded (model control is off) and the "
        "model-repository, shared-memory, logging and trace APIs are closed. Bind 127.0.0.1 "
        "(the default) unless other machines must reach the server, and then put it behind a "
        "firewall or an authenticating proxy."
    )
    loopback = _run(str(tmp_path), "--tritonserver", "/bin/false")
    assert loopback.exit_code == 1
    warnings = [line for line in loopback.stderr.splitlines() if line.startswith("Warning")]
    # as root, the one warning says so (issue 28); otherwise there is none
    assert warnings == ([root_warning()] if os.geteuid() == 0 else []), loopback.stderr


def _corrupted_repo(tmp_path: Path) -> tuple[Path, Path]:
    """A repository whose one engine model's folder no longer matches its
    build manifest (one weight byte changed after the build)."""
    from trtspec.integrity import MANIFEST, file_records

    engine = tmp_path / "engines" / "target"
    engine.mkdir(parents=True)
    (engine / "config.json").write_text("{}")
    (engine / "model.safetensors").write_bytes(b"\x00" * 64)
    (engine / MANIFEST).write_text(
        json.dumps(
            {"spec": "s", "engine": {"variants": ["baseline"]}, "files": file_records(engine)}
        )
    )
    repo = tmp_path / "repo"
    (repo / "target").mkdir(parents=True)
    (repo / "target" / "config.pbtxt").write_text(
        'name: "target"\nbackend: "python"\n'
        f'parameters {{ key: "gpt_model_path" value: {{ string_value: "{engine}" }} }}\n'
    )
    (repo / "trtspec-repo.json").write_text(
        json.dumps(
            {
                "schema_version": 1,
                "spec": "s",
                "backend": "reference",
                "models": {"target": {"role": "engine", "calls": [], "variant": None}},
                "variants": ["baseline"],
            }
        )
    )
    with open(engine / "model.safetensors", "r+b") as f:
        f.seek(10)
        f.write(b"\x01")  # same size: only the hash can tell
    return repo, engine


def test_serve_refuses_a_corrupted_engine_before_starting(tmp_path: Path) -> None:
    """Issue 28: `serve` checks the engines' sha256 manifest before load; a
    changed weight file is refused with the file, the reason and the rebuild
    command, and no tritonserver is started (/bin/false would fail louder)."""
    repo, engine = _corrupted_repo(tmp_path)
    result = _run(str(repo), "--tritonserver", "/bin/false", "--http-port", "0")
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    errors = [line for line in result.stderr.splitlines() if not line.startswith("Warning")]
    assert errors[1:] == [
        f"Error: {engine} (engine model 'target'): 1 file(s) no longer match its trtspec.json:",
        "  model.safetensors: content changed since the build (sha256 differs)",
        "Hint: rebuild it: `trtspec build SPEC --force --only baseline` (SPEC: the spec file of "
        "'s')",
    ], result.stderr
    assert errors[0].startswith("Starting tritonserver")
    assert "exited with code" not in result.stderr  # refused before any launch
