"""The rollout on a cluster, without one: the router's watcher on a folder
laid out as kubelet lays out a ConfigMap volume (tests/fixtures/kubelet_volume),
changes made through a loopback stand-in of the API server's ConfigMap
endpoint (tests/fixtures/kube_api: merge patch, resourceVersion precondition,
409, RBAC's 403), the exact requests the router sends and the exact kubectl
argv the CLI sends, a rollback a replica decides when the shared state cannot
be written, and ``rollout status --prometheus`` reaching the request log's
verdict from the router's series. The served two-router test is
tests/integration/test_rollout_fleet_served.py."""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlparse

import numpy as np
import pytest
from click.testing import CliRunner
from tests.fixtures.kube_api import TOKEN, ConfigMapStore, Kubelet, api_server, kubectl
from tests.fixtures.kubelet_volume import layout, project

from trtspec.artifacts import rollout_kube
from trtspec.artifacts import rollout_state as st
from trtspec.artifacts.routing import choose, load_routing
from trtspec.cli.main import cli
from trtspec.rollout import prometheus
from trtspec.rollout.compare import compare, split
from trtspec.runtime.models.rollout_live import Live, Tracked, log_cost_us
from trtspec.runtime.rollout_window import percentile

CM, NS = "demo-rollout", "serving"


def _router(root: Path, percent: float = 5) -> tuple[Path, Any]:
    router = root / "triton_repo" / "demo" / "router"
    router.mkdir(parents=True)
    routes = {"code": {"variant": "ngram", "canary_percent": percent}}
    (router / "routing.json").write_text(json.dumps({"schema_version": 1, "routes": routes}))
    (router.parent / "trtspec-repo.json").write_text(json.dumps({"schema_version": 1}))
    return router, load_routing(router / "routing.json")


def _client(url: str, tmp_path: Path, name: str = CM) -> rollout_kube.HttpConfigMap:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    return rollout_kube.HttpConfigMap(name, NS, url, token)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[ConfigMapStore, str]]:
    store = ConfigMapStore(CM, NS)  # as `trtspec deploy k8s` writes it: no data
    with api_server(store) as url:
        yield store, url


# -- kubelet's layout ------------------------------------------------------------


def test_the_stand_in_lays_a_configmap_out_as_kubelet_does(tmp_path: Path) -> None:
    vol = tmp_path / "vol"
    vol.mkdir()
    assert project(vol, {"state.json": "{}", "history.jsonl": ""})
    first = layout(vol)
    ts = first["..data"]
    assert ts.startswith("..") and first[ts] == "dir" and ts != "..data"
    assert first["state.json"] == "..data/state.json"
    assert first["history.jsonl"] == "..data/history.jsonl"
    assert oct((vol / ts).stat().st_mode & 0o777) == "0o755"
    assert oct((vol / ts / "state.json").stat().st_mode & 0o777) == "0o644"
    assert not project(vol, {"state.json": "{}", "history.jsonl": ""})  # same bytes: no write
    assert project(vol, {"state.json": '{"a": 1}'})
    second = layout(vol)
    assert second["..data"] != ts and ts not in second  # swapped, old one removed
    assert "history.jsonl" not in second  # a key gone from the ConfigMap is gone
    assert (vol / "state.json").read_text() == '{"a": 1}'
    with pytest.raises(ValueError, match="invalid path"):
        project(vol, {"..secret": "x"})


def test_the_watcher_follows_a_kubelet_volume_and_the_newer_copy(tmp_path: Path) -> None:
    router, table = _router(tmp_path)
    digest = st.routing_digest(router / "routing.json")
    vol = tmp_path / "vol"
    vol.mkdir()
    project(vol, {})
    watcher = st.StateWatcher(table, router / "routing.json", vol)
    assert watcher.table().routes["code"].canary_percent == 5

    def state(percent: float, revision: int, sha: str = digest) -> st.RolloutState:
        return st.RolloutState(sha, {"code": st.RouteState(percent)}, revision)

    project(vol, {"state.json": json.dumps(state(25, 1).to_dict())})
    assert watcher.refresh(force=True).routes["code"].canary_percent == 25
    project(vol, {"state.json": json.dumps(state(50, 2).to_dict())})
    watcher._next = 0.0  # past the poll interval: a plain refresh sees the swap
    assert watcher.table().routes["code"].canary_percent == 50
    # a copy read from the API server: served when newer, not when older
    watcher.offer(state(100, 3))
    assert watcher.table().routes["code"].canary_percent == 100
    watcher.offer(state(5, 1))
    assert watcher.table().routes["code"].canary_percent == 50
    watcher.offer(state(0, 9, sha="0" * 64))  # another routing table's: refused
    assert watcher.table().routes["code"].canary_percent == 50


# -- the API server ----------------------------------------------------------------


def test_a_change_is_a_conditional_merge_patch_with_its_history(cluster, tmp_path) -> None:
    store, url = cluster
    router, table = _router(tmp_path)
    digest = st.routing_digest(router / "routing.json")
    api = _client(url, tmp_path)
    args = {"status": st.RAMPING, "action": "advance", "by": "ana", "why": "window ok"}
    entry, state = rollout_kube.change(api, digest, table, "code", percent=25, **args)
    assert (entry["from_percent"], entry["to_percent"], state.revision) == (5.0, 25.0, 1)
    get, patch = store.requests
    path = f"/api/v1/namespaces/{NS}/configmaps/{CM}"
    assert get == {"method": "GET", "path": path}
    assert patch["content_type"] == "application/merge-patch+json"
    assert patch["body"]["metadata"] == {"resourceVersion": "100"}
    assert sorted(patch["body"]["data"]) == ["history.jsonl", "state.json"]
    data = store.data()
    assert json.loads(data["state.json"])["routes"] == {
        "code": {"percent": 25.0, "status": "ramping"}
    }
    assert [e["why"] for e in rollout_kube.history_of(rollout_kube.from_object(store.get()))] == [
        "window ok"
    ]

    # another writer between our read and our patch: 409, read again, retried
    class Racing:
        name, namespace = api.name, api.namespace
        raced = False

        def get(self) -> rollout_kube.ConfigMapData:
            return api.get()

        def patch(self, data: dict[str, str], rv: str) -> rollout_kube.ConfigMapData:
            if not Racing.raced:
                Racing.raced = True
                rollout_kube.change(api, digest, table, "code", percent=50, **args)
            return api.patch(data, rv)

    args2 = {**args, "action": "rollback", "status": st.ROLLED_BACK, "why": "breach"}
    entry, state = rollout_kube.change(Racing(), digest, table, "code", percent=0, **args2)
    assert entry["from_percent"] == 50.0 and state.revision == 3  # planned on the winner's state
    codes = [r["method"] for r in store.requests]
    assert codes.count("PATCH") == 4  # ours, the racer's, ours refused (409), ours again
    history = rollout_kube.history_of(rollout_kube.from_object(store.get()))
    assert [e["to_percent"] for e in history] == [25.0, 50.0, 0.0]


def test_the_api_server_refuses_what_the_role_does_not_allow(cluster, tmp_path) -> None:
    _, url = cluster
    other = _client(url, tmp_path, name="someone-elses")
    with pytest.raises(rollout_kube.KubeError) as err:
        other.get()
    assert "HTTP 403" in err.value.message
    assert 'configmaps "someone-elses" is forbidden' in err.value.message
    bad = rollout_kube.HttpConfigMap(CM, NS, url, tmp_path / "missing-token")
    with pytest.raises(rollout_kube.KubeError, match="cannot read the ServiceAccount token"):
        bad.get()


def test_in_a_pod_the_client_finds_the_api_server_and_its_token(monkeypatch) -> None:
    for name in (rollout_kube.API_ENV, rollout_kube.TOKEN_ENV, rollout_kube.NAMESPACE_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(rollout_kube.CONFIGMAP_ENV, raising=False)
    assert rollout_kube.HttpConfigMap.from_env() is None  # not on a cluster: the folder only
    monkeypatch.setenv(rollout_kube.CONFIGMAP_ENV, CM)
    monkeypatch.setenv(rollout_kube.NAMESPACE_ENV, NS)
    # what kubelet puts in every pod's environment (the `kubernetes` Service)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    api = rollout_kube.HttpConfigMap.from_env()
    assert api is not None
    assert api.url == f"https://10.96.0.1:443/api/v1/namespaces/{NS}/configmaps/{CM}"
    assert api.token_file == Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    assert rollout_kube.HttpConfigMap.from_env().url.startswith("https://[fd00::1]:443/")


def test_the_history_keeps_its_newest_entries_within_its_budget() -> None:
    text = ""
    for i in range(50):
        text = rollout_kube.with_entry(text, {"i": i, "pad": "x" * 80}, limit=1000)
    kept = [json.loads(line)["i"] for line in text.splitlines()]
    assert len(text.encode()) <= 1000 and kept == list(range(50 - len(kept), 50))


# -- the router -------------------------------------------------------------------


class _Logger:
    warnings: ClassVar[list[str]] = []

    @classmethod
    def log_warn(cls, message: str) -> None:
        cls.warnings.append(message)

    @classmethod
    def log_info(cls, message: str) -> None:
        return


class _Stub:
    Logger = _Logger


def _serve(live: Live, n: int, *, error_on_canary: bool) -> list[str]:
    variants = []
    for i in range(n):
        now = live.table()
        choice = choose(now, "code", f"r{i}")
        tracked = Tracked()
        live.begin(tracked, table=now, route="code", request_id=f"r{i}", choice=choice, inputs={})
        final = {
            "completion_tokens": np.array([4], dtype=np.int32),
            "variant": np.array([choice.variant.encode()], dtype=np.object_),
        }
        tracked.track(final, is_final=True)
        live.end(tracked, "boom" if error_on_canary and choice.canary else None)
        variants.append(choice.variant)
    return variants


def test_a_router_on_a_cluster_patches_its_rollback_and_logs_to_its_streams(
    cluster, tmp_path, monkeypatch, capfd
) -> None:
    store, url = cluster
    router, table = _router(tmp_path, percent=50)
    vol = tmp_path / "vol"
    with Kubelet(store, vol, sync_s=3600):  # the volume never refreshes here: the API must do
        token = tmp_path / "token"
        token.write_text(TOKEN)
        for name, value in {
            st.DIR_ENV: str(vol),
            rollout_kube.CONFIGMAP_ENV: CM,
            rollout_kube.NAMESPACE_ENV: NS,
            rollout_kube.API_ENV: url,
            rollout_kube.TOKEN_ENV: str(token),
            rollout_kube.SCRATCH_ENV: str(tmp_path / "scratch"),
        }.items():
            monkeypatch.setenv(name, value)
        config = st.RolloutConfig(min_requests=5)
        live = Live(router, router / "routing.json", table, _Stub, config)
        try:
            assert live.kube is not None and live.scratch == tmp_path / "scratch"
            variants = _serve(live, 60, error_on_canary=True)
        finally:
            live.close()
        assert variants[-10:] == ["baseline"] * 10  # rolled back here at once
        state = rollout_kube.state_of(rollout_kube.from_object(store.get()), "cm")
        assert state is not None and state.routes["code"] == st.RouteState(0.0, st.ROLLED_BACK)
        (entry,) = rollout_kube.history_of(rollout_kube.from_object(store.get()))
        assert entry["who"] == "router (automatic)" and entry["trigger"] == "window"
        # nothing written into the read-only volume; the log went to stdout
        assert sorted(n for n in os.listdir(vol) if not n.startswith("..")) == []
        out = capfd.readouterr().out
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        assert len(lines) == 60 and {r["route"] for r in lines} == {"code"}


def test_a_rollback_that_cannot_be_recorded_is_served_and_retried(tmp_path, monkeypatch) -> None:
    router, table = _router(tmp_path, percent=50)
    store = ConfigMapStore(CM, NS)
    token = tmp_path / "token"
    token.write_text(TOKEN)
    monkeypatch.setenv(rollout_kube.CONFIGMAP_ENV, CM)
    monkeypatch.setenv(rollout_kube.NAMESPACE_ENV, NS)
    monkeypatch.setenv(rollout_kube.TOKEN_ENV, str(token))
    monkeypatch.setenv(rollout_kube.SCRATCH_ENV, str(tmp_path / "scratch"))
    monkeypatch.setenv(st.DIR_ENV, str(tmp_path / "vol"))
    monkeypatch.setenv(rollout_kube.API_ENV, "http://127.0.0.1:9")  # nothing listens
    _Logger.warnings.clear()
    live = Live(router, router / "routing.json", table, _Stub, st.RolloutConfig(min_requests=5))
    try:
        variants = _serve(live, 60, error_on_canary=True)
        assert variants[-10:] == ["baseline"] * 10 and "code" in live.pending
        assert any("could not be recorded in the API server" in w for w in _Logger.warnings)
        for _ in range(3):  # an API server that stays away is reported once, not every poll
            live._poll_once()
        assert sum("reading the shared state" in w for w in _Logger.warnings) == 1
        # the API server is back: the next poll records it
        with api_server(store) as url:
            live.kube = rollout_kube.HttpConfigMap(CM, NS, url, token)
            live._poll_once()
        assert live.pending == {}
        assert _Logger.warnings[-1] == "rollout: the API server answers again"
        state = rollout_kube.state_of(rollout_kube.from_object(store.get()), "cm")
        assert state is not None and state.routes["code"].status == st.ROLLED_BACK
    finally:
        live.close()


def test_a_router_whose_folder_cannot_be_written_still_rolls_back(tmp_path, monkeypatch) -> None:
    import errno

    router, table = _router(tmp_path, percent=50)

    def read_only(folder: Path, *args: Any, **kwargs: Any) -> None:
        # what a read-only mount answers every writer, root included
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(folder / st.LOCK_FILE))

    monkeypatch.setattr(st, "change", read_only)
    config = st.RolloutConfig(min_requests=5, log={**st.RolloutConfig().log, "destination": "off"})
    _Logger.warnings.clear()
    live = Live(router, router / "routing.json", table, _Stub, config)
    try:
        variants = _serve(live, 60, error_on_canary=True)
    finally:
        live.close()
    assert variants[-10:] == ["baseline"] * 10 and "code" in live.pending
    assert any(
        f"could not be recorded in {router / 'rollout'}" in w and "Read-only file system" in w
        for w in _Logger.warnings
    )


# -- trtspec rollout --kube ---------------------------------------------------------


def _repo_with_log(tmp_path: Path) -> Path:
    router, _ = _router(tmp_path)
    config = st.RolloutConfig(min_requests=20)
    (router / st.CONFIG_FILE).write_text(json.dumps(config.to_dict()))
    return router.parent


def test_the_cli_drives_the_configmap_through_kubectl(tmp_path, monkeypatch) -> None:
    from trtspec.build import executor

    repo = _repo_with_log(tmp_path)
    store = ConfigMapStore(CM, NS)
    run = kubectl(store, context="prod")
    monkeypatch.setattr(executor, "run_subprocess", run)
    kube = ["--kube", "demo", "--context", "prod", "--namespace", NS]
    runner = CliRunner()
    moved = runner.invoke(
        cli, ["rollout", "advance", "code", str(repo), *kube, "--force", "--by", "ana"]
    )
    assert moved.exit_code == 0, moved.output
    assert moved.stdout == "code: 5% → 25% (advance, ramping)\n"
    assert "every router pod applies it within 5 s" in moved.stderr
    base = ["kubectl", "--context", "prod", "--namespace", NS]
    get = [*base, "get", "configmap", CM, "--output", "json"]
    assert run.calls[0] == get
    patch = run.calls[-1]
    assert patch[:10] == [*base, "patch", "configmap", CM, "--type", "merge"]
    assert patch[10] == "--patch" and patch[12:] == ["--output", "json"]
    assert json.loads(patch[11])["metadata"] == {"resourceVersion": "100"}
    back = runner.invoke(cli, ["rollout", "rollback", "code", str(repo), *kube, "--by", "bo"])
    assert back.exit_code == 0 and "25% → 0% (rollback, rolled_back)" in back.stdout
    history = runner.invoke(cli, ["rollout", "history", str(repo), *kube, "--format", "json"])
    assert [(e["action"], e["who"]) for e in json.loads(history.stdout)] == [
        ("advance", "ana"),
        ("rollback", "bo"),
    ]
    # no request log on a cluster: the error says where it is
    status = runner.invoke(cli, ["rollout", "status", str(repo), *kube])
    assert status.exit_code == 1
    assert "Error: on a cluster the routers log each request to their pods' stdout" in (
        status.stderr
    )
    wrong = runner.invoke(cli, ["rollout", "history", str(repo), *kube[2:], "--kube", "nope"])
    assert wrong.exit_code == 1
    assert f"kubectl could not reach the rollout ConfigMap {NS}/nope-rollout" in wrong.stderr
    assert 'Error from server (NotFound): configmaps "nope-rollout" not found' in wrong.stderr
    alone = runner.invoke(cli, ["rollout", "history", str(repo), "--context", "prod"])
    assert alone.exit_code == 2 and "--context needs --kube NAME" in alone.output


# -- rollout status --prometheus ----------------------------------------------------


def _records(arm: str, n: int, ms_per_token: float, errors: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(7 + n + len(arm))
    out = []
    for i in range(n):
        cost = ms_per_token * float(np.exp(rng.normal(0, 0.2)))
        out.append(
            {
                "route": "code",
                "arm": arm,
                "variant": "ngram" if arm == "canary" else "baseline",
                "completion_tokens": 16,
                "latency_ms": None if i < errors else cost * 16,
                "ttft_ms": None if i < errors else cost,
                "error": "boom" if i < errors else None,
                "draft_tokens": 20 if arm == "canary" else 0,
                "accepted_tokens": 15 if arm == "canary" else 0,
            }
        )
    return out


def _as_prometheus(records: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """What the router's series would give each query over these requests
    (exact sums; the percentiles exact where Prometheus interpolates buckets)."""
    out: dict[str, dict[str, float]] = {k: {} for k in prometheus.queries("code", 60)}
    for arm in ("canary", "control"):
        mine = [r for r in records if r["arm"] == arm]
        ok = [r for r in mine if r["error"] is None]
        costs = [c for r in ok if (c := log_cost_us(r)) is not None]
        got = {
            "requests": len(mine),
            "errors": len(mine) - len(ok),
            "ttft_p50": percentile([r["ttft_ms"] / 1000 for r in ok], 50),
            "ttft_p95": percentile([r["ttft_ms"] / 1000 for r in ok], 95),
            "latency_p50": percentile([r["latency_ms"] / 1000 for r in ok], 50),
            "latency_p95": percentile([r["latency_ms"] / 1000 for r in ok], 95),
            "latency_sum": sum(r["latency_ms"] / 1000 for r in ok),
            "tokens": sum(r["completion_tokens"] for r in ok),
            "accepted": sum(r["accepted_tokens"] for r in ok),
            "drafted": sum(r["draft_tokens"] for r in ok),
            "cost_n": len(costs),
            "cost_sum": sum(costs),
            "cost_squares": sum(c * c for c in costs),
        }
        for key, value in got.items():
            if value is not None:
                out[key][arm] = float(value)
    return out


@pytest.fixture
def fake_prometheus() -> Iterator[tuple[str, dict[str, Any]]]:
    """A loopback server answering ``GET /api/v1/query`` in the HTTP API's
    format (prometheus docs/querying/api.md): instant vectors from
    ``answers[promql]`` (arm -> value), 400 with ``status: error`` otherwise."""
    answers: dict[str, Any] = {}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            return

        def do_GET(self) -> None:
            url = urlparse(self.path)
            query = parse_qs(url.query).get("query", [""])[0]
            if url.path != "/api/v1/query" or query not in answers["values"]:
                code, body = 400, {"status": "error", "errorType": "bad_data", "error": "parse"}
            else:
                result = [
                    {"metric": {"arm": arm}, "value": [1733300000.0, repr(v)]}
                    for arm, v in answers["values"][query].items()
                ]
                code = 200
                body = {"status": "success", "data": {"resultType": "vector", "result": result}}
            raw = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", answers
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("canary_ms", "canary_errors", "verdict"),
    [(5.0, 0, "advance"), (10.2, 0, "hold"), (5.0, 6, "rollback")],
)
def test_status_from_prometheus_reaches_the_request_logs_verdict(
    tmp_path, fake_prometheus, canary_ms: float, canary_errors: int, verdict: str
) -> None:
    url, answers = fake_prometheus
    repo = _repo_with_log(tmp_path)
    records = _records("canary", 40, canary_ms, canary_errors) + _records("control", 80, 10.0)
    sent = prometheus.queries("code", 600)
    by_name = _as_prometheus(records)
    answers["values"] = {sent[name]: by_name[name] for name in sent}
    res = CliRunner().invoke(
        cli,
        ["rollout", "status", str(repo), "--prometheus", url, "--since", "10m", "--format", "json"],
    )
    assert res.exit_code == 0, res.output
    (report,) = json.loads(res.stdout)["routes"]
    canary, control = split(records, "code", 1000)
    local = compare("code", canary, control, st.DEFAULT_THRESHOLDS, 20)
    assert report["verdict"] == local.verdict == verdict, (report["reasons"], local.reasons)
    assert report["reasons"] == local.reasons
    for key in ("point", "ci_low", "ci_high"):
        assert math.isclose(report["speedup"][key], local.speedup[key], rel_tol=1e-9)
    assert report["canary"]["requests"] == 40 and report["canary"]["errors"] == canary_errors


def test_the_prometheus_queries_are_the_ones_documented() -> None:
    q = prometheus.queries('co"de', 900)
    assert q["requests"] == (
        'sum by (arm) (increase(trtspec_requests_total{route="co\\"de"}[900s]))'
    )
    assert q["latency_p95"] == (
        "histogram_quantile(0.95, sum by (arm, le) "
        '(increase(trtspec_latency_seconds_bucket{route="co\\"de"}[900s])))'
    )
    assert q["cost_squares"].startswith("sum by (arm) (increase(trtspec_log_cost_squares_total")


def test_a_prometheus_that_refuses_a_query_is_a_clear_error(tmp_path, fake_prometheus) -> None:
    url, answers = fake_prometheus
    answers["values"] = {}
    repo = _repo_with_log(tmp_path)
    res = CliRunner().invoke(cli, ["rollout", "status", str(repo), "--prometheus", url])
    assert res.exit_code == 1
    assert f"Error: Prometheus at {url} refused" in res.stderr and "parse" in res.stderr
    assert "Traceback" not in res.output
