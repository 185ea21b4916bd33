"""What ``trtspec rollout`` does, without Click: open a served repository's
rollout (``Deployment``), compare canary and control per promoted route over
a window of the request log (``status``), move a route to the next step of
its ramp when the window supports it (``advance``; ``force`` overrides and
is recorded), send it back to its fallback (``rollback``), and read the
history. The state lives in a ``Store``: the rollout folder on one machine
(``FolderStore``: ``artifacts.rollout_state.change``, an atomic replace of
``state.json`` that the running router picks up at its next request, and a
line in ``history.jsonl``), or a deployment's rollout ConfigMap on
Kubernetes (``ConfigMapStore``: ``artifacts.rollout_kube.change``, a conditional
merge patch that every router pod reads within ``rollout_kube.poll_s()``).
On a cluster the request log is the pods' stdout (``--log`` a collected
copy) or, for ``status``, the cluster's Prometheus (``rollout.prometheus``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtspec.artifacts import rollout_kube
from trtspec.artifacts import rollout_state as st
from trtspec.artifacts.repo_manifest import ROUTING_FILE
from trtspec.artifacts.routing import RoutingTable, load_routing
from trtspec.errors import GateFailed, RepoError
from trtspec.rollout.compare import ADVANCE, Comparison, compare, split
from trtspec.rollout.prometheus import Query, compare_from_prometheus
from trtspec.runtime.models.rollout_log import read_lines

ROUTER_DIR = "router"
# The window `status --prometheus` reads when --since is not given.
PROMETHEUS_RANGE_S = 900.0


@dataclass(frozen=True)
class FolderStore:
    """The rollout folder of a router on this machine."""

    folder: Path

    @property
    def where(self) -> str:
        return str(self.folder)

    def state(self) -> st.RolloutState | None:
        return st.read_state(self.folder / st.STATE_FILE)

    def history(self) -> list[dict[str, Any]]:
        return st.read_history(self.folder)

    def change(
        self, routing_path: Path, table: RoutingTable, route: str, **args: Any
    ) -> dict[str, Any] | None:
        return st.change(self.folder, routing_path, table, route, **args)


@dataclass(frozen=True)
class ConfigMapStore:
    """A deployment's rollout ConfigMap (``artifacts.rollout_kube``)."""

    api: rollout_kube.ConfigMapAPI

    @property
    def where(self) -> str:
        return f"configmap {self.api.namespace}/{self.api.name}"

    def state(self) -> st.RolloutState | None:
        return rollout_kube.state_of(self.api.get(), self.where)

    def history(self) -> list[dict[str, Any]]:
        return rollout_kube.history_of(self.api.get())

    def change(
        self, routing_path: Path, table: RoutingTable, route: str, **args: Any
    ) -> dict[str, Any] | None:
        done = rollout_kube.change(self.api, st.routing_digest(routing_path), table, route, **args)
        return None if done is None else done[0]


@dataclass(frozen=True)
class Deployment:
    repo: Path
    router_dir: Path
    routing_path: Path
    table: RoutingTable
    config: st.RolloutConfig
    folder: Path
    store: FolderStore | ConfigMapStore

    @property
    def log_path(self) -> Path:
        return self.folder / st.LOG_FILE

    @property
    def on_cluster(self) -> bool:
        return isinstance(self.store, ConfigMapStore)

    def state(self) -> st.RolloutState | None:
        """The valid state (``st.validate_state``: an invalid one is a
        ``RepoError`` naming the file, the field and the fix), or None."""
        state = self.store.state()
        digest = st.routing_digest(self.routing_path)
        if state is not None and state.routing_sha256 != digest:
            return None  # written for another routing table; the router ignores it too
        return state

    def promoted(self) -> list[str]:
        """Routes with a variant of their own to roll out."""
        return [n for n, r in self.table.routes.items() if r.variant != r.fallback_variant]

    def rule(self, route: str) -> Any:
        if route not in self.promoted():
            known = ", ".join(self.promoted()) or "none"
            raise RepoError(
                f"{self.routing_path}: route {route!r} has no variant to roll out "
                f"(routes with one: {known})",
                "Name a route `trtspec bench` promoted; see `trtspec rollout status`.",
            )
        return self.table.routes[route]


def open_deployment(repo: Path, api: rollout_kube.ConfigMapAPI | None = None) -> Deployment:
    """The rollout of the repository ``repo`` (``triton_repo/<spec>`` or its
    parent): its routing table and rollout config, and its state in the
    rollout folder, or in the ConfigMap ``api`` reaches when given (the
    deployment of that repository on a cluster)."""
    from trtspec.serve.manifest import resolve_repo

    repo = resolve_repo(repo)
    router_dir = repo / ROUTER_DIR
    routing_path = router_dir / ROUTING_FILE
    if not routing_path.is_file():
        raise RepoError(
            f"{routing_path}: no routing table",
            "Pass the folder `trtspec repo` wrote (triton_repo/<spec>).",
        )
    folder = st.rollout_dir(router_dir)
    return Deployment(
        repo=repo,
        router_dir=router_dir,
        routing_path=routing_path,
        table=load_routing(routing_path),
        config=st.RolloutConfig.load(router_dir),
        folder=folder,
        store=FolderStore(folder) if api is None else ConfigMapStore(api),
    )


def read_log(dep: Deployment, log: Path | None, since_s: float | None) -> list[dict[str, Any]]:
    path = log or dep.log_path
    if log is None and dep.on_cluster:
        raise RepoError(
            "on a cluster the routers log each request to their pods' stdout",
            "Pass a collected log with --log FILE (e.g. `kubectl logs -l "
            "app.kubernetes.io/instance=NAME -c tritonserver --tail=-1 > requests.log`), "
            "or read the routers' series with --prometheus URL.",
        )
    if log is None and dep.config.log.get("destination") != "file":
        raise RepoError(
            f"the router logs to {dep.config.log.get('destination')}, not to {path}",
            "Pass the collected log with --log FILE.",
        )
    records = read_lines(path)
    if since_s is not None:
        cutoff = time.time() - since_s
        records = [r for r in records if float(r.get("time") or 0) >= cutoff]
    return records


def route_status(
    dep: Deployment,
    route: str,
    records: list[dict[str, Any]],
    window: int | None,
    *,
    prometheus: Query | None = None,
    since_s: float | None = None,
) -> dict[str, Any]:
    """One route's report: from the request log's ``records`` (the last
    ``window`` per arm), or from the router's series in ``prometheus`` over
    the last ``since_s`` seconds (``PROMETHEUS_RANGE_S`` by default)."""
    rule = dep.rule(route)
    now = st.current(dep.table, dep.state(), route)
    comparison: Comparison
    if prometheus is not None:
        comparison = compare_from_prometheus(
            prometheus,
            route,
            since_s or PROMETHEUS_RANGE_S,
            dep.config.thresholds,
            dep.config.min_requests,
        )
    else:
        canary, control = split(records, route, window or dep.config.window_requests)
        comparison = compare(route, canary, control, dep.config.thresholds, dep.config.min_requests)
    return {
        "route": route,
        "variant": rule.variant,
        "fallback_variant": rule.fallback_variant,
        "percent": now.percent,
        "status": now.status,
        "next_percent": None
        if now.status == st.ROLLED_BACK
        else st.step_after(dep.config.steps, now.percent),
        "thresholds": dep.config.thresholds,
        "min_requests": dep.config.min_requests,
        **comparison.as_dict(),
    }


def status(
    dep: Deployment,
    *,
    routes: list[str] | None = None,
    window: int | None = None,
    since_s: float | None = None,
    log: Path | None = None,
    prometheus: Query | None = None,
) -> list[dict[str, Any]]:
    records = [] if prometheus is not None else read_log(dep, log, since_s)
    return [
        route_status(dep, r, records, window, prometheus=prometheus, since_s=since_s)
        for r in (routes or dep.promoted())
    ]


def advance(
    dep: Deployment,
    route: str,
    *,
    by: str,
    why: str,
    force: bool = False,
    window: int | None = None,
    since_s: float | None = None,
    log: Path | None = None,
    prometheus: Query | None = None,
) -> dict[str, Any]:
    """Move ``route`` to its next step; ``GateFailed`` (exit 3) when the
    window does not support it and ``force`` is not given."""
    rule = dep.rule(route)
    now = st.current(dep.table, dep.state(), route)
    if now.status == st.ROLLED_BACK and not force:
        raise GateFailed(
            f"route {route!r} was rolled back to {rule.fallback_variant}",
            "Restart its ramp with --force once the cause is fixed.",
        )
    start_over = now.status == st.ROLLED_BACK
    target = dep.config.steps[0] if start_over else st.step_after(dep.config.steps, now.percent)
    if target is None:
        raise GateFailed(f"route {route!r} already sends 100% to {rule.variant}")
    if prometheus is not None:
        report: dict[str, Any] | None = route_status(
            dep, route, [], window, prometheus=prometheus, since_s=since_s
        )
    elif force and log is None and (dep.on_cluster or not dep.log_path.exists()):
        report = None
    else:
        report = route_status(dep, route, read_log(dep, log, since_s), window)
    if report is not None and report["verdict"] != ADVANCE and not force:
        raise GateFailed(
            f"route {route!r} held at {now.percent:g}%: " + "; ".join(report["reasons"]),
            "Wait for more traffic, or pass --force (recorded in the history).",
        )
    entry = dep.store.change(
        dep.routing_path,
        dep.table,
        route,
        percent=float(target),
        status=st.COMPLETE if target >= 100 else st.RAMPING,
        action="advance",
        by=by,
        why=why,
        details={
            "forced": bool(force and (report is None or report["verdict"] != ADVANCE)),
            "verdict": None if report is None else report["verdict"],
            "reasons": None if report is None else report["reasons"],
            "speedup": None if report is None else report["speedup"],
        },
    )
    assert entry is not None
    return entry


def rollback(dep: Deployment, route: str, *, by: str, why: str) -> dict[str, Any]:
    dep.rule(route)
    entry = dep.store.change(
        dep.routing_path,
        dep.table,
        route,
        percent=0.0,
        status=st.ROLLED_BACK,
        action="rollback",
        by=by,
        why=why,
    )
    assert entry is not None
    return entry


def history(dep: Deployment) -> list[dict[str, Any]]:
    return dep.store.history()
