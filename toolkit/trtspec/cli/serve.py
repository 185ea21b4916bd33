"""``trtspec serve``: run a model repository under a supervised tritonserver,
print its endpoints on stdout once it is ready, and stop it cleanly (no server
or stub left behind) on Ctrl-C or SIGTERM. All the work is in ``trtspec.serve``."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from types import FrameType

import click

from trtspec.cli._options import host_option
from trtspec.cli._output import emit_json, emit_table, format_option, progress
from trtspec.serve import (
    Incident,
    Server,
    StubWatchdog,
    detect_world_size,
    engine_models,
    fallback_covered,
    resolve_repo,
    variant_models,
)
from trtspec.serve.access import exposure_warning, root_warning

_port = click.IntRange(0, 65535)


class _StopRequested(Exception):
    """Raised from the SIGINT/SIGTERM handler so the supervisor's cleanup runs."""


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _StopRequested(signal.Signals(signum).name)


@click.command("serve")
@click.argument("repo", type=click.Path(path_type=Path, file_okay=False))
@click.option("--variant", help="Load only this variant and the models it calls.")
@host_option("Address to bind; anything but loopback prints what it exposes.")
@click.option("--http-port", type=_port, default=8000, show_default=True, help="0 = any free port.")
@click.option("--grpc-port", type=_port, default=8001, show_default=True, help="0 = any free port.")
@click.option(
    "--metrics-port", type=_port, default=8002, show_default=True, help="0 = any free port."
)
@click.option(
    "--tritonserver",
    "binary",
    type=click.Path(path_type=Path, dir_okay=False),
    help="tritonserver binary (default: PATH, /opt/tritonserver/bin, nvidia-pytriton).",
)
@click.option(
    "--log-file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Where the server log goes (default: a new file in the temp folder).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=300.0,
    show_default=True,
    help="Seconds to wait for the server to become ready.",
)
@click.option(
    "--world-size",
    type=click.IntRange(min=1),
    help="TP×PP ranks (default: read from the engines' config.json; >1 runs mpirun: "
    "orchestrator mode with several engine models, leader mode with one).",
)
@format_option
def serve_command(
    *,
    repo: Path,
    variant: str | None,
    host: str,
    http_port: int,
    grpc_port: int,
    metrics_port: int,
    binary: Path | None,
    log_file: Path | None,
    timeout: float,
    world_size: int | None,
    fmt: str,
) -> None:
    """Serve the Triton model repository REPO until Ctrl-C or SIGTERM.

    REPO is the folder `trtspec repo` wrote (triton_repo/<spec>) or its parent
    when that holds one spec. Endpoints go to stdout once the server is ready."""
    repo = resolve_repo(repo)
    models = variant_models(repo, variant) if variant else None
    ranks = world_size or detect_world_size(repo)
    server = Server(
        repo,
        binary=binary,
        host=host,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        models=models,
        log_path=log_file,
        world_size=ranks,
        engine_models=engine_models(repo, models) if ranks > 1 else (),
    )
    for warning in (exposure_warning(host, http_port, grpc_port, metrics_port), root_warning()):
        if warning:
            progress(warning)
    # Installed explicitly: a shell starting us in the background ignores SIGINT
    # for us, and `kill -INT` must still stop the server.
    previous_int = signal.signal(signal.SIGINT, _raise_stop)
    previous_term = signal.signal(signal.SIGTERM, _raise_stop)
    ready = False

    def said(incident: Incident) -> None:
        if incident.model in covered:
            progress(f"Warning: {incident.message()}; {incident.action}")
            return
        took = f" in {incident.recovery_s:.1f} s" if incident.recovery_s is not None else ""
        progress(f"Error: {incident.message()}; {incident.action}{took}")

    # A dead stub is noticed within a second, a frozen one (its heartbeat
    # stopped: docs/design/triton-limits.md) within ~10 s and killed. One only a
    # speculative variant uses leaves that variant down (the router serves its
    # routes from their fallback); any other restarts the server on the same
    # ports; a dead server ends the command (check_alive below).
    covered = fallback_covered(repo, models)
    watchdog = StubWatchdog(server, on_incident=said, restart_dead_server=False, fallback=covered)
    try:
        progress(f"Starting tritonserver ({server.install.source}); log: {server.log_path}")
        server.start(timeout=timeout)
        watchdog.prime().start()  # before the endpoints are out: no crash goes unseen
        ready = True
        endpoints = server.endpoints()
        info = {
            **endpoints,
            "models": models if models is not None else "all",
            "pid": server.pid,
            "world_size": ranks,
            "launch": server.launch_mode,
        }
        if fmt == "json":
            emit_json(info)
        else:
            emit_table(["endpoint", "address"], [[k, v] for k, v in endpoints.items()])
        progress("Ready. Press Ctrl-C to stop.")
        while True:
            watchdog.check_alive()
            if watchdog.failed is not None:
                raise watchdog.failed
            time.sleep(0.5)
    except (KeyboardInterrupt, _StopRequested):
        if not ready:
            raise KeyboardInterrupt from None
    finally:
        # A second Ctrl-C must not cut the teardown short and orphan the server.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            watchdog.stop()
            if server.running:
                progress("Stopping tritonserver…")
            server.stop()
        finally:
            signal.signal(signal.SIGINT, previous_int)
            signal.signal(signal.SIGTERM, previous_term)
    progress("Stopped.")


COMMANDS: list[click.Command] = [serve_command]
