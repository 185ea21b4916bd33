"""``trtspec rollout``: watch and move a served repository's rollout —
``status`` (per promoted route, canary vs control over a window of the
request log, with the speedup interval and the bench's thresholds),
``advance ROUTE`` (the next step of the ramp, only when the window supports
it, or ``--force``; exit 3 when held), ``rollback ROUTE`` and ``history``.
A thin wrapper over ``trtspec.rollout.manage``; the running router applies a
change at its next request, with no restart. With ``--kube NAME`` every
command works on the deployment NAME's rollout ConfigMap in a cluster
(through kubectl, ``trtspec.rollout.kube``) instead of the local rollout
folder; ``--prometheus URL`` judges the window from the routers' series."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click

from trtspec.cli._options import namespace_option
from trtspec.cli._output import emit_json, emit_table, format_option, progress

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

repo_argument = click.argument(
    "repo",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("triton_repo"),
    required=False,
)


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    match = _DURATION.match(value.strip())
    if not match:
        raise click.BadParameter(f"{value!r} is not a duration; e.g. 90s, 15m, 2h")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


window_options = [
    click.option(
        "--window",
        type=click.IntRange(min=2),
        help="Most recent requests per arm to compare (default: the spec's "
        "rollout.window_requests).",
    ),
    click.option(
        "--since", callback=_duration, help="Only requests of the last DURATION (e.g. 15m)."
    ),
    click.option(
        "--log",
        "log_path",
        type=click.Path(path_type=Path, dir_okay=False),
        help="A request log to read instead of the router's (e.g. one collected from stdout).",
    ),
]


kube_options = [
    click.option(
        "--kube",
        "kube",
        metavar="NAME",
        help="Work on the deployment NAME in a Kubernetes cluster (`trtspec deploy k8s "
        "--name`): its rollout ConfigMap NAME-rollout, through kubectl.",
    ),
    click.option("--context", help="The kubeconfig context (with --kube)."),
    namespace_option("The namespace (with --kube)."),
]
by_option = click.option("--by", "by", default=None, help="Who (default: the current user).")
prometheus_option = click.option(
    "--prometheus",
    metavar="URL",
    help="Judge the window from the routers' series in this Prometheus (e.g. "
    "http://127.0.0.1:9090) over --since (default 15m) instead of a request log.",
)


def _with_window(func: Any) -> Any:
    for option in reversed(window_options):
        func = option(func)
    return func


def _with_kube(func: Any) -> Any:
    for option in reversed(kube_options):
        func = option(func)
    return func


def _open(repo: Path, kube: str | None, context: str | None, namespace: str) -> Any:
    from trtspec.rollout.kube import KubectlConfigMap, KubeTarget
    from trtspec.rollout.manage import open_deployment

    if kube is None:
        if context is not None:
            raise click.UsageError("--context needs --kube NAME")
        return open_deployment(repo)
    return open_deployment(repo, KubectlConfigMap(KubeTarget(kube, namespace, context)))


def _query(url: str | None) -> Any:
    from trtspec.rollout.prometheus import http_query

    return None if url is None else http_query(url)


def _f(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def _rows(report: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for arm in ("canary", "control"):
        a = report[arm]
        variant = report["variant"] if arm == "canary" else report["fallback_variant"]
        rows.append(
            [
                report["route"],
                arm,
                variant,
                a["requests"],
                _f(a["error_rate"] * 100 if a["error_rate"] is not None else None, ".1f"),
                _f(a["ttft_p50_ms"]),
                _f(a["ttft_p95_ms"]),
                _f(a["latency_p50_ms"]),
                _f(a["latency_p95_ms"]),
                _f(a["tokens_per_second"]),
                _f(a["acceptance"], ".2f"),
            ]
        )
    return rows


HEADERS = [
    "route",
    "arm",
    "variant",
    "n",
    "err %",
    "ttft p50",
    "ttft p95",
    "lat p50",
    "lat p95",
    "tok/s",
    "accept",
]


def _summary_line(report: dict[str, Any]) -> str:
    sp = report["speedup"]
    speed = (
        "speedup -"
        if sp is None
        else f"speedup {sp['point']:.2f}x [{sp['ci_low']:.2f}, {sp['ci_high']:.2f}] "
        f"({sp['confidence']:.0%})"
    )
    reg = report["p95_regression"]
    p95 = "-" if reg is None else f"{reg:+.0%}"
    t = report["thresholds"]
    nxt = report["next_percent"]
    return (
        f"{report['route']}: {report['percent']:g}% on {report['variant']} ({report['status']}); "
        f"{speed}, p95 latency {p95}; verdict {report['verdict']}"
        + (f" → next {nxt}%" if nxt is not None and report["verdict"] == "advance" else "")
        + f"\n    {'; '.join(report['reasons'])}"
        + f"\n    thresholds: speedup CI low > {t['min_speedup']:.2f}, p95 ≤ "
        f"+{t['max_p95_regression']:.0%}, errors ≤ {t['max_error_rate']:.1%}, "
        f"≥ {report['min_requests']} requests per arm"
    )


@click.group("rollout")
def rollout() -> None:
    """Watch and ramp a served repository's rollout (canary → 100%)."""


@rollout.command("status")
@repo_argument
@click.option("--route", "routes", multiple=True, help="Only this route (repeatable).")
@_with_window
@prometheus_option
@_with_kube
@format_option
def status_command(
    *,
    repo: Path,
    routes: tuple[str, ...],
    window: int | None,
    since: float | None,
    log_path: Path | None,
    prometheus: str | None,
    kube: str | None,
    context: str | None,
    namespace: str,
    fmt: str,
) -> None:
    """Per promoted route: canary vs control over the window (p50/p95 TTFT
    and latency, tokens/s, acceptance, error rate), the speedup interval,
    and whether the window supports the next step."""
    from trtspec.rollout.manage import status

    dep = _open(repo, kube, context, namespace)
    reports = status(
        dep,
        routes=list(routes) or None,
        window=window,
        since_s=since,
        log=log_path,
        prometheus=_query(prometheus),
    )
    if fmt == "json":
        emit_json({"repository": str(dep.repo), "routes": reports})
        return
    if not reports:
        click.echo("no promoted routes: every route is served by its fallback")
        return
    emit_table(HEADERS, [row for r in reports for row in _rows(r)])
    for r in reports:
        click.echo(_summary_line(r))


@rollout.command("advance")
@click.argument("route")
@repo_argument
@click.option("--force", is_flag=True, help="Advance even when the window does not support it.")
@click.option("--why", default=None, help="Why (recorded in the history).")
@by_option
@_with_window
@prometheus_option
@_with_kube
@format_option
def advance_command(
    *,
    route: str,
    repo: Path,
    force: bool,
    why: str | None,
    by: str | None,
    window: int | None,
    since: float | None,
    log_path: Path | None,
    prometheus: str | None,
    kube: str | None,
    context: str | None,
    namespace: str,
    fmt: str,
) -> None:
    """Move ROUTE to the next step of its ramp (exit 3 when held)."""
    from trtspec.artifacts.rollout_state import who
    from trtspec.rollout.manage import advance

    dep = _open(repo, kube, context, namespace)
    entry = advance(
        dep,
        route,
        by=by or who(),
        why=why or ("forced" if force else "the window supports it"),
        force=force,
        window=window,
        since_s=since,
        log=log_path,
        prometheus=_query(prometheus),
    )
    _emit_change(entry, fmt, dep.on_cluster)


@rollout.command("rollback")
@click.argument("route")
@repo_argument
@click.option("--why", default="rolled back by hand", show_default=True, help="Why (recorded).")
@by_option
@_with_kube
@format_option
def rollback_command(
    *,
    route: str,
    repo: Path,
    why: str,
    by: str | None,
    kube: str | None,
    context: str | None,
    namespace: str,
    fmt: str,
) -> None:
    """Send ROUTE to its fallback variant."""
    from trtspec.artifacts.rollout_state import who
    from trtspec.rollout.manage import rollback

    dep = _open(repo, kube, context, namespace)
    entry = rollback(dep, route, by=by or who(), why=why)
    _emit_change(entry, fmt, dep.on_cluster)


@rollout.command("history")
@repo_argument
@_with_kube
@format_option
def history_command(
    *, repo: Path, kube: str | None, context: str | None, namespace: str, fmt: str
) -> None:
    """Every rollout change: when, who, what and why."""
    from trtspec.rollout.manage import history

    entries = history(_open(repo, kube, context, namespace))
    if fmt == "json":
        emit_json(entries)
        return
    emit_table(
        ["when", "who", "route", "action", "from %", "to %", "why"],
        [
            [
                e["when"],
                e["who"],
                e["route"],
                e["action"],
                e["from_percent"],
                e["to_percent"],
                e["why"],
            ]
            for e in entries
        ],
    )


def _emit_change(entry: dict[str, Any], fmt: str, on_cluster: bool = False) -> None:
    if fmt == "json":
        emit_json(entry)
        return
    click.echo(
        f"{entry['route']}: {entry['from_percent']:g}% → {entry['to_percent']:g}% "
        f"({entry['action']}, {entry['status']})"
    )
    if on_cluster:
        from trtspec.artifacts.rollout_kube import POLL_S

        progress(
            f"every router pod applies it within {POLL_S:g} s (it reads the ConfigMap "
            "through the API server); history: `trtspec rollout history --kube NAME`"
        )
    else:
        progress("the router applies it at its next request; history: `trtspec rollout history`")


COMMANDS: list[click.Command] = [rollout]
