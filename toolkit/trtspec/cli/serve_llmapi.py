"""``trtspec serve-llmapi``: one ``trtllm-serve`` per variant of an LLM-API
spec (``trtspec.flows.llmapi_serve``), from the files ``trtspec build``
wrote; endpoints and the matching ``bench.external`` entries go to stdout once
every server is healthy, and Ctrl-C or SIGTERM stops them all."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from types import FrameType

import click
import yaml

from trtspec.cli._options import engines_option, host_option
from trtspec.cli._output import emit_json, emit_table, format_option, progress


class _StopRequested(Exception):
    """Raised from the SIGINT/SIGTERM handler so the fleet's cleanup runs."""


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _StopRequested(signal.Signals(signum).name)


@click.command("serve-llmapi")
@click.argument("spec_path", metavar="SPEC", type=click.Path(dir_okay=False))
@engines_option("Engines root; the files are in ENGINES/<spec>/llmapi/.")
@host_option("Address to bind; anything but loopback prints what it exposes.")
@click.option(
    "--base-port",
    type=click.IntRange(1, 65535),
    default=8100,
    show_default=True,
    help="Port of the baseline; each variant takes the next one, in spec order.",
)
@click.option("--trtllm-serve", "binary", help="trtllm-serve executable (default: PATH).")
@click.option(
    "--log-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("logs"),
    show_default=True,
    help="One trtllm-serve.<variant>.log each.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=1800.0,
    show_default=True,
    help="Seconds to wait for every server's /health.",
)
@format_option
def serve_llmapi(
    *,
    spec_path: str,
    engines_root: Path,
    host: str,
    base_port: int,
    binary: str | None,
    log_dir: Path,
    timeout: float,
    fmt: str,
) -> None:
    """Serve every variant of an LLM-API spec with its own trtllm-serve."""
    from trtspec.errors import SpecError
    from trtspec.flows import stage_plan
    from trtspec.flows.llmapi_config import serve_commands
    from trtspec.flows.llmapi_serve import TrtllmServeFleet
    from trtspec.serve.access import trtllm_serve_exposure_warning
    from trtspec.spec import load_spec

    spec = load_spec(spec_path)
    if not spec.flow.llm_api:
        raise SpecError(
            [f"{spec_path}: flow: trtllm-serve serves LLM-API specs only"],
            "set `flow: llmapi`, or serve the engine flow's repository with `trtspec serve`",
        )
    # the plan `trtspec build` wrote (a stale one refused); the files it wrote are checked next
    plan = stage_plan(spec, engines_root, spec_path=spec_path)
    commands = serve_commands(spec, plan, engines_root, base_port=base_port, host=host)
    missing = [a[-1] for a in commands.values() if not Path(a[-1]).is_file()]
    if missing:
        raise click.UsageError(f"{missing[0]} not found: run `trtspec build {spec_path}` first")
    warning = trtllm_serve_exposure_warning(host, [base_port + i for i in range(len(commands))])
    if warning is not None:
        progress(warning)
    previous = {s: signal.signal(s, _raise_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with TrtllmServeFleet(commands, log_dir, binary=binary) as fleet:
            progress(f"Starting {len(commands)} trtllm-serve process(es) …")
            fleet.start(timeout)
            arms = fleet.external_arms(spec.model_location(spec.target.model).ref)
            if fmt == "json":
                emit_json({m.variant: {"url": m.url, "argv": m.argv} for m in fleet.members})
            else:
                emit_table(["variant", "url", "log"],
                           [[m.variant, m.url, str(m.log)] for m in fleet.members])  # fmt: skip
                click.echo("# bench.external entries for these servers:")
                click.echo(yaml.safe_dump({"bench": {"external": arms}}, sort_keys=False))
            while True:
                time.sleep(1.0)
    except _StopRequested as stop:
        progress(f"{stop}: stopping the trtllm-serve processes")
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


COMMANDS: list[click.Command] = [serve_llmapi]
