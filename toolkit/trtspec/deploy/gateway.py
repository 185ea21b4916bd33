"""Per-route canary at the cluster's gateway (``deploy k8s --gateway``): one
pool per variant (a Deployment or LeaderWorkerSet and its Service) instead
of one pool serving every variant, and a Gateway API ``HTTPRoute`` that
splits each route's traffic by weight between its variant's pool and the
baseline's. Latency-predicting pickers (the Gateway API Inference
Extension's) assume the pods behind one pool are alike, which a pool mixing
a canary and its baseline is not.

A request names its route in the ``x-trtspec-route`` header (the same value
as the request's ``route`` input, which the in-pod router reads); the
``HTTPRoute`` matches on it. Inside a variant's pool the router serves that
route on the variant at 100% (the gateway did the split) and keeps what a
gateway cannot do: the fallback to the baseline when the variant fails
before its first token, the ``max_concurrency`` spill to the baseline, the
draft-length schedule and the golden mirror; the baseline stays loaded there
for them. Each pool's table reaches its pods through a ConfigMap the init
container installs (``trtspec.deploy.relocate --routing``). Written against
the ``HTTPRoute`` v1 CRD of kubernetes-sigs/gateway-api v1.3.0 (the schema
the tests validate against). No Click here.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from trtspec.artifacts.repo_manifest import ROUTING_FILE
from trtspec.artifacts.routing import RoutingTable
from trtspec.catalogue import BASELINE
from trtspec.deploy.k8s_pod import SECRET_KEY
from trtspec.deploy.options import HTTP_PORT, K8sOptions, Manifests, labels, meta
from trtspec.deploy.sizing import DeployError, Sizing, size_instance
from trtspec.serve.access import new_admin_key

HTTPROUTE_API = "gateway.networking.k8s.io/v1"
ROUTE_HEADER = "x-trtspec-route"
MAX_RULES = 16  # HTTPRoute spec.rules maxItems (gateway-api v1.3.0)
WEIGHT_SCALE = 100  # weights in hundredths of a percent: a 2.5% canary is 250 of 10,000
POOL_LABEL = "trtspec.dev/pool"
_UNSAFE = re.compile(r"[^a-z0-9-]+")


def pool_name(opts: K8sOptions, pool: str) -> str:
    return f"{opts.name}-{_UNSAFE.sub('-', pool.lower()).strip('-')}"


def pool_tables(table: RoutingTable) -> dict[str, RoutingTable]:
    """Each pool's routing table: the baseline's serves everything on the
    baseline; a variant's serves its routes on the variant at 100% (the
    gateway weighs the canary), with the route's fallback, cap and schedule."""
    pools: dict[str, RoutingTable] = {BASELINE: RoutingTable(default_variant=BASELINE, routes={})}
    for route, rule in sorted(table.routes.items()):
        if rule.variant == BASELINE or rule.canary_percent <= 0:
            continue
        current = pools.get(rule.variant) or RoutingTable(default_variant=BASELINE, routes={})
        routes = {**current.routes, route: dataclasses.replace(rule, canary_percent=100.0)}
        pools[rule.variant] = RoutingTable(default_variant=BASELINE, routes=routes)
    return pools


def _parent(gateway: str, opts: K8sOptions) -> dict[str, str]:
    namespace, sep, name = gateway.rpartition("/")
    ref = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": name}
    if sep and namespace:
        ref["namespace"] = namespace
    return ref


def _backend(opts: K8sOptions, pool: str, weight: int) -> dict[str, Any]:
    return {"name": pool_name(opts, pool), "port": HTTP_PORT, "weight": weight}


def http_route(table: RoutingTable, opts: K8sOptions) -> dict[str, Any]:
    """One rule per canary route (header match, weighted variant and
    baseline pools) and a last rule sending everything else to the baseline."""
    assert opts.gateway is not None
    rules: list[dict[str, Any]] = []
    for route, rule in sorted(table.routes.items()):
        if rule.variant == BASELINE or rule.canary_percent <= 0:
            continue
        canary = round(rule.canary_percent * WEIGHT_SCALE)
        backends = [_backend(opts, rule.variant, canary)]
        if canary < 100 * WEIGHT_SCALE:
            backends.append(_backend(opts, BASELINE, 100 * WEIGHT_SCALE - canary))
        match = {"headers": [{"type": "Exact", "name": ROUTE_HEADER, "value": route}]}
        rules.append({"matches": [match], "backendRefs": backends})
    rules.append({"backendRefs": [_backend(opts, BASELINE, 1)]})
    if len(rules) > MAX_RULES:
        raise DeployError(
            f"{len(rules) - 1} canary routes need {len(rules)} HTTPRoute rules; an HTTPRoute "
            f"holds at most {MAX_RULES}",
            "deploy without --gateway (the in-pod router splits any number of routes)",
        )
    return {
        "apiVersion": HTTPROUTE_API,
        "kind": "HTTPRoute",
        "metadata": meta(opts.name, opts),
        "spec": {"parentRefs": [_parent(opts.gateway, opts)], "rules": rules},
    }


def pool_options(opts: K8sOptions, pool: str) -> K8sOptions:
    """One pool's options: its own names and routing ConfigMap; the claim and
    the key Secret shared with the other pools."""
    name = pool_name(opts, pool)
    return dataclasses.replace(
        opts, name=name, pvc=opts.claim, secret_name=opts.secret, write_secret=False,
        routing_config=f"{name}-routing", ssh_secret_name=opts.ssh_secret,
    )  # fmt: skip


def routing_configmap(table: RoutingTable, popts: K8sOptions) -> dict[str, Any]:
    assert popts.routing_config is not None
    doc_meta = meta(popts.routing_config, popts)
    doc_meta["labels"] = {**labels(popts.name)}
    text = json.dumps(table.to_dict(), indent=2, sort_keys=True) + "\n"
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc_meta,
            "data": {ROUTING_FILE: text}}  # fmt: skip


def manifests(
    spec: Any, plan: Any, mp: Any, opts: K8sOptions, *, repo: Any, routing_file: Any,
    gpu_bytes: int | None, startup_seconds: int | None,
) -> tuple[Manifests, Sizing]:  # fmt: skip
    """Every pool's objects (each as ``k8s.build`` writes one deployment, its
    files prefixed with the pool), the shared claim and Secret, the
    ``HTTPRoute``; and the baseline pool's sizing."""
    from trtspec.deploy.inputs import served_from
    from trtspec.deploy.k8s import POPULATED_MARKER, build, models_claim, populate_job

    whole = served_from(spec, plan, repo=repo, routing_file=routing_file)
    tables = pool_tables(whole.routing)
    if len(tables) == 1:
        raise DeployError(
            "--gateway: the routing table sends no route to a variant, so there is no canary "
            "to split",
            "deploy without --gateway",
        )
    files: dict[str, list[dict[str, Any]]] = {}
    extra: dict[str, str] = {}
    pools: dict[str, Any] = {}
    sizings: dict[str, Sizing] = {}
    notes: list[str] = []
    baseline: dict[str, Any] = {}
    for pool, table in tables.items():
        popts = pool_options(opts, pool)
        served = served_from(spec, plan, repo=repo, routing_file=routing_file, table=table)
        sizing = size_instance(
            spec, mp, served.engines, gpus_per_node=opts.gpus_per_node, gpu_bytes=gpu_bytes,
            startup_override=startup_seconds, engine_gpus_per_node=served.engine_gpus_per_node,
        )  # fmt: skip
        made = build(spec, served, sizing, popts)
        for name, docs in made.files.items():
            files[f"{pool}-{name}"] = docs
        files[f"{pool}-routing.yaml"] = [routing_configmap(table, popts)]
        extra.update(made.extra)
        notes += [n for n in made.summary["notes"] if n not in notes]
        sizings[pool] = sizing
        baseline = baseline or made.summary
        pools[pool] = {"name": popts.name, "models": served.models,
                       "routing": table.to_dict(), "sizing": sizing.to_dict()}  # fmt: skip
    if opts.repo_source == "volume" and opts.pvc is None:
        # one claim for every pool, sized for the whole repository
        every = size_instance(
            spec, mp, whole.engines, gpus_per_node=max(sizings[BASELINE].world_size,
                                                       opts.gpus_per_node),
            gpu_bytes=None, startup_override=startup_seconds,
        )  # fmt: skip
        files["volume.yaml"] = [models_claim(whole, every, opts), populate_job(whole, every, opts)]
        notes.append(
            f"copy {whole.root}/ onto the claim {opts.claim} through the {opts.name}-populate "
            f"Job's pod, then touch {POPULATED_MARKER} there"
        )
    if opts.write_secret:
        files["secret.yaml"] = [{"apiVersion": "v1", "kind": "Secret",
                                 "metadata": meta(opts.secret, opts), "type": "Opaque",
                                 "stringData": {SECRET_KEY: new_admin_key()}}]  # fmt: skip
    files["httproute.yaml"] = [http_route(whole.routing, opts)]
    summary = {**baseline, "gateway": opts.gateway, "route_header": ROUTE_HEADER,
               "routing": whole.routing.to_dict(), "variants": whole.variants, "pools": pools,
               "files": sorted([*files, *extra]), "notes": notes}  # fmt: skip
    return Manifests(files, extra, summary), sizings[BASELINE]
