"""``trtspec bench`` (run the paired per-route benchmark) and ``trtspec
report`` (re-render a saved or interrupted run). Thin wrappers over
``trtspec.bench``: stdout carries the decision lines (or ``--format json``
summary), stderr the progress; ``--fail-on`` breaches exit 3, a run with too
many failed requests exits 1."""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from trtspec.cli._options import engines_option
from trtspec.cli._options import fail_on_option as shared_fail_on_option
from trtspec.cli._output import emit_json, format_option, progress
from trtspec.errors import BenchError, GateFailed

if TYPE_CHECKING:
    from trtspec.artifacts.bench_run import Summary

DEFAULT_MAX_ERROR_RATE = 0.05


def _csv(kind: Callable[[str], Any], what: str) -> Callable[..., Any]:
    def convert(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
        if value is None:
            return None
        out = []
        for raw in value.split(","):
            part = raw.strip()
            if not part:
                continue
            try:
                out.append(kind(part))
            except ValueError:
                raise click.BadParameter(f"{part!r} is not {what}") from None
        if not out:
            raise click.BadParameter("expected a comma-separated list")
        return out

    return convert


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def _temperature(text: str) -> float:
    from trtspec.runtime.limits import BENCH_TEMPERATURE_MAX, temperature_problem

    value = float(text)
    if temperature_problem(value) is not None or value > BENCH_TEMPERATURE_MAX:
        raise ValueError(text)
    return value


no_plots_option = click.option("--no-plots", is_flag=True, help="Skip the PNG plots.")
fail_on_option = shared_fail_on_option(
    'Exit 3 when a condition holds, e.g. "speedup<1.0@code_completion,error_rate>0.01".'
)
max_error_option = click.option(
    "--max-error-rate",
    type=click.FloatRange(0.0, 1.0),
    default=DEFAULT_MAX_ERROR_RATE,
    show_default=True,
    help="Exit 1 when more than this share of measured requests failed.",
)


def _finish(
    summary: Summary, gates: list[Any], max_error_rate: float, fmt: str, run_dir: Path
) -> None:
    from trtspec.bench.gates import check_gates
    from trtspec.bench.report_console import console_lines
    from trtspec.bench.report_notes import incident_note

    if fmt == "json":
        emit_json(summary)
    else:
        for line in console_lines(summary):
            click.echo(line)
    progress(f"report: {run_dir / 'report.html'}  routing: {run_dir / 'routing.yaml'}")
    for warning in (summary.get("client") or {}).get("warnings") or []:
        progress(f"Warning: {warning}")
    for incident in summary.get("incidents") or []:
        progress(f"Warning: {incident_note(incident)}")
    if summary.get("incomplete_reason"):
        raise BenchError(
            f"the benchmark is incomplete: {summary['incomplete_reason']}",
            hint=f'partial results are in {run_dir} (summary.json: "complete": false); '
            "decisions there use only the requests that completed",
        )
    totals = summary["totals"]
    if totals["error_rate"] is not None and totals["error_rate"] > max_error_rate:
        raise BenchError(
            f"{totals['errors']} of {totals['requests']} measured requests failed "
            f"({totals['error_rate']:.1%} > --max-error-rate {max_error_rate:.1%})",
            hint=f"see the `error` field in {run_dir / 'requests.jsonl'} and the server log",
        )
    breaches = check_gates(gates, summary["cells"])
    if breaches:
        raise GateFailed("--fail-on breached:\n  " + "\n  ".join(str(b) for b in breaches))


@click.command("bench")
@click.argument("spec_path", metavar="SPEC", type=click.Path(path_type=Path))
@click.option(
    "--endpoint",
    metavar="HOST:PORT",
    help="gRPC address of a running server; default: start one on the repository.",
)
@click.option(
    "--metrics-url",
    metavar="HOST:PORT",
    help="Triton metrics address for server memory (with --endpoint).",
)
@click.option(
    "--repo",
    type=click.Path(path_type=Path),
    help="Model repository to serve (default triton_repo/<spec name>).",
)
@click.option("--variants", callback=_csv(str, "a variant name"), help="Only these variants.")
@click.option("--routes", callback=_csv(str, "a route name"), help="Only these routes.")
@click.option(
    "--concurrency",
    callback=_csv(_positive_int, "a positive integer"),
    help="Closed-loop levels, e.g. 1,8,32: requests of one arm in flight (the unit of "
    "routing.yaml's max_concurrency).",
)
@click.option(
    "--request-rate",
    type=click.FloatRange(min=0.0, min_open=True),
    help="Also run an open-loop Poisson load at this many requests/s.",
)
@click.option(
    "--temperatures",
    callback=_csv(_temperature, "a temperature in [0, 2]"),
    help="Sampling temperatures, e.g. 0,0.7.",
)
@click.option(
    "--num-draft-tokens",
    callback=_csv(_positive_int, "a positive integer"),
    help="Sweep k for draft_model/ngram variants (no rebuild), e.g. 2,4,6.",
)
@click.option(
    "--requests",
    type=click.IntRange(min=1),
    help="A fixed count of requests per route and arm (turns --until-decided off).",
)
@click.option(
    "--until-decided/--fixed-count",
    default=True,
    show_default=True,
    help="Send pairs in batches until each variant's speedup is decided "
    "(sequential CI, see docs/design/decisions.md) or --max-requests is reached; "
    "--fixed-count sends the spec's requests per route.",
)
@click.option(
    "--max-requests",
    type=click.IntRange(min=2),
    default=30,
    show_default=True,
    help="Most pairs per route and arm under --until-decided.",
)
@click.option(
    "--prefix-cache",
    type=click.Choice(["cold", "warm", "off"]),
    default="cold",
    show_default=True,
    help="Cache state every arm starts a prompt from: cold = no arm reuses another "
    "arm's KV blocks (arms sharing an engine model get their own copy); warm = "
    "each request follows a 1-token request for its prompt; off = as served.",
)
@click.option(
    "--warmup", "warmup_requests", type=click.IntRange(min=0), help="Warmup requests per arm."
)
@click.option(
    "--isolate", is_flag=True, help="Serve one variant at a time, each in its own tritonserver."
)
@click.option(
    "--tokenizer",
    type=click.Path(path_type=Path),
    help="Tokenizer folder for chat templates (default the target engine's).",
)
@engines_option("Engines root folder.")
@click.option(
    "--output",
    type=click.Path(path_type=Path),
    default=Path("results"),
    show_default=True,
    help="Results root; the run goes to OUTPUT/<spec>-<time>/.",
)
@click.option("--run-dir", type=click.Path(path_type=Path), help="Exact run folder.")
@click.option(
    "--timeout",
    "request_timeout_s",
    type=click.FloatRange(min=0.1),
    help="Seconds to wait for one request's final response (default 300).",
)
@no_plots_option
@click.option(
    "--external",
    callback=_csv(str, "an external arm name"),
    metavar="NAMES",
    help="Only these external (OpenAI-compatible) arms of bench.external; 'none' drops them all.",
)
@click.option(
    "--external-only",
    is_flag=True,
    help="Bench only the external arms (no tritonserver is started or contacted).",
)
@fail_on_option
@max_error_option
@format_option
def bench_command(
    *,
    spec_path: Path,
    output: Path,
    run_dir: Path | None,
    no_plots: bool,
    gates: list[Any],
    max_error_rate: float,
    fmt: str,
    **flags: Any,
) -> None:
    """Benchmark every variant of SPEC against the baseline, per route."""
    # Every other option's name is its BenchOptions field (CLI_ONLY below the
    # exceptions): a flag is declared once here and once in the dataclass.
    from trtspec.bench.progress import RouteBars
    from trtspec.bench.runner import BenchOptions, run_benchmark
    from trtspec.spec import load_spec

    if flags["external"] == ["none"]:
        if flags["external_only"]:
            raise click.UsageError("--external none and --external-only leave no arm to bench")
        flags["external"] = []
    spec = load_spec(spec_path)
    from trtspec.flows.llmapi_config import greedy_at

    greedy = greedy_at(spec, flags["temperatures"])
    if greedy is not None:
        click.echo(f"Warning: {greedy}", err=True)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = run_dir or output / f"{spec.name}-{stamp}"
    result = run_benchmark(
        spec,
        BenchOptions(output_dir=run_dir, plots=not no_plots, **flags),
        progress=progress,
        bars=RouteBars(sys.stderr),
    )
    _finish(result.summary, gates, max_error_rate, fmt, result.run_dir)


# bench_command's parameters that are not a BenchOptions field of the same name
CLI_ONLY = ("spec_path", "output", "run_dir", "no_plots", "gates", "max_error_rate", "fmt")


@click.command("report")
@click.argument("run_dir", metavar="RUN_DIR", type=click.Path(path_type=Path))
@no_plots_option
@fail_on_option
@max_error_option
@format_option
def report_command(
    run_dir: Path, no_plots: bool, gates: list[Any], max_error_rate: float, fmt: str
) -> None:
    """Re-render summary.json, routing.yaml and the reports of RUN_DIR from
    its requests.jsonl (works on an interrupted run)."""
    from trtspec.bench.report import render_run

    summary = render_run(run_dir, plots=not no_plots)
    _finish(summary, gates, max_error_rate, fmt, run_dir)


COMMANDS: list[click.Command] = [bench_command, report_command]
