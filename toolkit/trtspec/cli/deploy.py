"""``trtspec deploy``: hand the decided deployment to engines that run at
scale. ``deploy k8s SPEC`` writes Kubernetes manifests for the engine flow
(Deployment, or LeaderWorkerSet across nodes); ``deploy dynamo`` writes NVIDIA
Dynamo graphs from per-variant LLM-API engine configs. Everything is checked
before anything is written; the output folder appears whole or not at all.
All the work is in ``trtspec.deploy``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from trtspec.cli._memory import gpu_memory_option, memory_for
from trtspec.cli._options import engines_option, namespace_option
from trtspec.cli._output import emit_json, emit_table, format_option, progress

#: a deploy command's own output folder, replaced only when asked
replace_option = click.option("--force", is_flag=True, help="Replace an existing output folder.")
replicas_option = click.option(
    "--replicas", type=click.IntRange(min=1), default=1, show_default=True
)


def gpus_per_node_option(help: str | None = None) -> Any:
    return click.option(
        "--gpus-per-node", type=click.IntRange(min=1), default=8, show_default=True, help=help
    )


@click.group("deploy")
def deploy() -> None:
    """Write Kubernetes manifests or Dynamo graphs for a built, benchmarked spec."""


def _summary_rows(summary: dict[str, Any]) -> list[list[Any]]:
    from trtspec.deploy.sizing import gib_text

    s = summary["sizing"]
    rows = [
        ["launch", f"{s['launch']} (TP×PP = {s['world_size']})"],
        ["pods per instance", s["pods_per_instance"]],
        ["GPUs per pod", s["gpus_per_pod"]],
        ["replicas", summary["replicas"]],
        ["GPUs in all", s["gpus_per_instance"] * summary["replicas"]],
        ["models loaded", ", ".join(summary["models"])],
        [
            "per GPU (min / full KV)",
            f"{gib_text(s['need_min_bytes_per_gpu'])} / {gib_text(s['need_full_bytes_per_gpu'])}",
        ],
        ["fit", s["verdict"]],
        ["start-up budget", f"{s['startup_seconds']} s"],
        ["repository hash", summary["repository_hash"] or "not built on this machine"],
        ["files", ", ".join(summary["files"])],
    ]
    cap = summary.get("capacity")
    if cap:
        rows.insert(4, ["capacity", f"{cap['rate_rps']:g} req/s ÷ {cap['per_instance_rps']:g} "
                                    f"req/s per instance ({cap['route']} at {cap['level']} in "
                                    f"flight) → {cap['replicas']} replicas"])  # fmt: skip
    return rows


@deploy.command("k8s")
@click.argument("spec_path", metavar="SPEC", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--image", help="Serving image: trtspec on the spec's pinned Triton image.")
@click.option(
    "--repo",
    "repo_dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="The built repository (triton_repo/<spec>); without it, names come from the plan.",
)
@click.option(
    "--routing",
    "routing_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="routing.yaml to deploy (must match the repository's router when --repo is given).",
)
@engines_option("Engines root (ENGINES/<spec>/).")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    help="Output folder [default: deploy/<spec>].",
)
@replace_option
@click.option("--name", help="Resource name [default: the spec name].")
@namespace_option()
@gpus_per_node_option("GPUs of one node; TP×PP above it makes a LeaderWorkerSet.")
@gpu_memory_option
@replicas_option
@click.option("--hpa-max", type=click.IntRange(min=1), help="Add an autoscaler up to N replicas.")
@click.option(
    "--hpa-metric", type=click.Choice(["router", "queue", "inflight"]), default="router",
    show_default=True,
    help="router: requests in flight at the router; queue: Triton's pending requests on the "
    "router; inflight: TRT-LLM active requests.",
)  # fmt: skip
@click.option(
    "--hpa-target", type=click.FloatRange(min=0, min_open=True), default=4.0, show_default=True,
    help="Average value of the metric per pod the autoscaler keeps.",
)  # fmt: skip
@click.option(
    "--repo-source", type=click.Choice(["volume", "image"]), default="volume", show_default=True,
    help="Model repository from a PersistentVolumeClaim, or baked into an image layer.",
)  # fmt: skip
@click.option(
    "--pvc",
    help="An existing PersistentVolumeClaim holding the repository [default: write NAME-models].",
)
@click.option("--pvc-size", help="Size of the claim written [default: the data, plus 20%].")
@click.option("--storage-class", help="StorageClass of the claim written [default: the cluster's].")
@click.option(
    "--models-path", default="/models", show_default=True,
    help="Where the pods see the volume (or image layer) with the repository and engines.",
)  # fmt: skip
@click.option(
    "--baseline-only", is_flag=True,
    help="Deploy the baseline alone although the spec has variants (no routing table).",
)  # fmt: skip
@click.option(
    "--monitor-label", "monitor_labels", multiple=True, metavar="KEY=VALUE",
    help="A label on the ServiceMonitor for Prometheus to select it (e.g. release=prometheus).",
)  # fmt: skip
@click.option(
    "--toleration", "tolerations", multiple=True, metavar="KEY[=VALUE]:EFFECT",
    help="Tolerate a node taint (repeat); replaces the default nvidia.com/gpu:NoSchedule.",
)  # fmt: skip
@click.option(
    "--gateway", metavar="[NAMESPACE/]GATEWAY",
    help="Split each route's canary at this Gateway (HTTPRoute weights), one pool per variant.",
)  # fmt: skip
@click.option(
    "--compute-capability", metavar="MAJOR.MINOR",
    help="GPU architecture the engines were built for, when their build did not record it.",
)  # fmt: skip
@click.option("--repo-image", help="With --repo-source image: the image the Dockerfile builds.")
@click.option(
    "--startup-seconds", type=click.IntRange(min=30), help="Override the start-up budget."
)
@click.option("--write-secret", is_flag=True, help="Also write a Secret with a new random key.")
@click.option(
    "--rate", type=click.FloatRange(min=0, min_open=True),
    help="Requests/s to serve: sets --replicas from --throughput-from.",
)  # fmt: skip
@click.option(
    "--throughput-from", "summary_file", type=click.Path(path_type=Path, dir_okay=False),
    help="summary.json of a benchmark on the deployment's GPUs (with --rate).",
)  # fmt: skip
@click.option("--route", "rate_route", help="With --rate: the route whose throughput counts.")
@click.option("--level", type=click.IntRange(min=1), help="With --rate: the concurrency level.")
@format_option
def k8s_command(
    *,
    spec_path: Path,
    image: str | None,
    repo_dir: Path | None,
    routing_file: Path | None,
    engines_root: Path,
    out: Path | None,
    force: bool,
    name: str | None,
    namespace: str,
    gpus_per_node: int,
    gpu_bytes: int | None,
    replicas: int,
    hpa_max: int | None,
    hpa_metric: str,
    hpa_target: float,
    repo_source: str,
    pvc: str | None,
    pvc_size: str | None,
    storage_class: str | None,
    models_path: str,
    baseline_only: bool,
    monitor_labels: tuple[str, ...],
    tolerations: tuple[str, ...],
    compute_capability: str | None,
    gateway: str | None,
    repo_image: str | None,
    startup_seconds: int | None,
    write_secret: bool,
    rate: float | None,
    summary_file: Path | None,
    rate_route: str | None,
    level: int | None,
    fmt: str,
) -> None:
    """Write Kubernetes manifests serving SPEC's repository under Triton.

    GPUs, ranks and the load list come from the spec, its memory plan and the
    routing table; nothing is written when they cannot work."""
    from trtspec.deploy import k8s_manifests
    from trtspec.deploy.k8s import write
    from trtspec.deploy.options import K8sOptions
    from trtspec.flows import stage_plan
    from trtspec.spec import load_spec

    ctx = click.get_current_context()
    per_instance = None
    if rate is not None:
        if summary_file is None or rate_route is None or level is None:
            raise click.UsageError("--rate needs --throughput-from, --route and --level")
        if ctx.get_parameter_source("replicas") is not click.core.ParameterSource.DEFAULT:
            raise click.UsageError("--rate sets the replicas: leave out --replicas")
        if gateway:
            raise click.UsageError(
                "--rate with --gateway: each pool takes its own share; size them with --replicas"
            )
        per_instance = _instance_rps(summary_file, rate_route, level)
    spec = load_spec(spec_path)
    plan = stage_plan(spec, engines_root, spec_path=spec_path)
    mp = memory_for(spec, plan, gpu_bytes)
    opts = K8sOptions(
        image=image or "",
        name=name or spec.name.replace(".", "-").replace("_", "-"),
        namespace=namespace,
        gpus_per_node=gpus_per_node,
        replicas=replicas,
        hpa_max=hpa_max,
        hpa_metric=hpa_metric,
        hpa_target=hpa_target,
        repo_source=repo_source,
        pvc=pvc,
        pvc_size=pvc_size,
        storage_class=storage_class,
        models_path=models_path,
        repo_image=repo_image,
        write_secret=write_secret,
        monitor_labels=dict(_pair(item, "--monitor-label") for item in monitor_labels),
        tolerations=[_toleration(t) for t in tolerations] if tolerations else None,
        compute_capability=compute_capability,
        gateway=gateway,
    )
    manifests, sizing = k8s_manifests(
        spec, plan, mp, opts, repo=repo_dir, routing_file=routing_file,
        gpu_bytes=gpu_bytes, startup_seconds=startup_seconds, baseline_only=baseline_only,
    )  # fmt: skip
    if rate is not None and per_instance is not None:
        from trtspec.deploy.sizing import capacity

        cap = capacity(sizing, rate, per_instance)
        opts.replicas = cap.replicas
        manifests, sizing = k8s_manifests(
            spec, plan, mp, opts, repo=repo_dir, routing_file=routing_file,
            gpu_bytes=gpu_bytes, startup_seconds=startup_seconds, baseline_only=baseline_only,
        )  # fmt: skip
        manifests.summary["capacity"] = {
            "rate_rps": rate, "per_instance_rps": round(per_instance, 3),
            "route": rate_route, "level": level, "replicas": cap.replicas,
            "pods": cap.pods, "gpus": cap.gpus,
        }  # fmt: skip
    for note in [*sizing.notes, *manifests.summary["notes"]]:
        progress(f"Note: {note}")
    target = out or Path("deploy") / spec.name
    write(target, manifests, force=force)
    progress(f"Wrote {target}/ ({len(manifests.resources())} resources)")
    summary = {**manifests.summary, "out": str(target)}
    if fmt == "json":
        emit_json(summary)
    else:
        emit_table(["deployment", str(target)], _summary_rows(summary))


def _pair(item: str, option: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise click.BadParameter(f"{item!r}: write KEY=VALUE", param_hint=option)
    return key, value


def _toleration(item: str) -> dict[str, str]:
    """``KEY[=VALUE]:EFFECT`` as a toleration (``Equal`` with a value, else ``Exists``)."""
    taint, sep, effect = item.rpartition(":")
    if not sep or not taint or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
        raise click.BadParameter(
            f"{item!r}: write KEY[=VALUE]:EFFECT, EFFECT one of NoSchedule, PreferNoSchedule, "
            "NoExecute",
            param_hint="--toleration",
        )
    key, eq, value = taint.partition("=")
    if eq:
        return {"key": key, "operator": "Equal", "value": value, "effect": effect}
    return {"key": key, "operator": "Exists", "effect": effect}


def _instance_rps(path: Path, route: str, level: int) -> float:
    import json

    from trtspec.deploy.sizing import DeployError, instance_rps

    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DeployError(
            f"{path}: cannot read the benchmark summary: {exc}",
            "pass the summary.json `trtspec bench` wrote (results/<run>/summary.json)",
        ) from None
    if not isinstance(summary, dict):
        raise DeployError(f"{path}: not a benchmark summary", "pass results/<run>/summary.json")
    return instance_rps(summary, route, level, str(path))


def _engine_config(item: str) -> tuple[str, dict[str, Any]]:
    import yaml

    from trtspec.deploy.sizing import DeployError

    variant, sep, file = item.partition("=")
    if not sep or not variant or not file:
        raise click.BadParameter(f"{item!r}: write VARIANT=FILE", param_hint="--engine-config")
    try:
        data = yaml.safe_load(Path(file).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise DeployError(
            f"{file}: cannot read the engine config of variant {variant}: {exc}",
            "pass the LLM-API options YAML trtspec wrote for the variant",
        ) from None
    if not isinstance(data, dict):
        raise DeployError(
            f"{file}: the engine config of variant {variant} is not a mapping",
            "pass the LLM-API options YAML trtspec wrote for the variant",
        )
    return variant, data


def _spec_configs(spec_path: Path, engines_root: Path) -> tuple[str, dict[str, Any], str]:
    """(spec name, variant -> LLM-API document, target model) of an LLM-API
    spec: the documents ``trtspec build`` writes to engines/<spec>/llmapi/,
    generated and checked against the pinned field table, each with the whole
    KV-cache fraction (a graph has its GPUs to itself; one trtspec server
    splits it over the variants it holds)."""
    from trtspec.deploy.sizing import DeployError
    from trtspec.flows import llmapi_config, stage_plan
    from trtspec.spec import load_spec

    spec = load_spec(spec_path)
    if not spec.flow.llm_api:
        raise DeployError(
            f"{spec_path}: spec {spec.name} uses the {spec.flow.kind} flow; Dynamo's "
            "TensorRT-LLM workers run the LLM-API flow",
            "set `flow: llmapi` in the spec, or deploy the engine flow with `trtspec deploy k8s`",
        )
    docs = llmapi_config.documents(spec, stage_plan(spec, engines_root, spec_path=spec_path))
    fraction = float(spec.target.kv_cache.free_gpu_mem_fraction)
    for doc in docs.values():
        doc["kv_cache_config"] = {**doc["kv_cache_config"], "free_gpu_memory_fraction": fraction}
    from trtspec.deploy.dynamo import check_trtllm

    check_trtllm(llmapi_config.settings(spec).trtllm_version, str(spec_path))
    return spec.name, docs, str(docs["baseline"]["model"])


@deploy.command("dynamo")
@click.option(
    "--spec", "spec_path", type=click.Path(dir_okay=False, path_type=Path),
    help="An LLM-API spec (flow: llmapi): graphs from its generated configs.",
)  # fmt: skip
@engines_option("Engines root (with --spec).")
@click.option(
    "--routing", "routing_file", type=click.Path(dir_okay=False, path_type=Path),
    help="routing.yaml the benchmark decided: graphs for the variants it promotes, plus the "
    "baseline, each with its route's max_concurrency.",
)  # fmt: skip
@click.option("--baseline-only", is_flag=True, help="With --spec and no --routing: the baseline.")
@click.option("--spec-name", help="Name prefix of the graphs (default with --spec: its name).")
@click.option(
    "--engine-config", "configs", multiple=True, metavar="VARIANT=FILE",
    help="A variant's LLM-API engine config (repeat per variant, baseline included); with "
    "--spec, replaces that variant's generated one.",
)  # fmt: skip
@click.option("--model", help="Hub id (or a folder on --model-pvc) [default with --spec: target].")
@click.option("--model-pvc", help="A claim holding the model (and draft) folders, at /models.")
@click.option("--model-root", help="The folder on this machine the --model-pvc claim holds.")
@click.option(
    "--image", default=None,
    help="Dynamo TensorRT-LLM runtime image [default: the pinned release's].",
)  # fmt: skip
@namespace_option()
@gpus_per_node_option()
@replicas_option
@click.option("--disaggregated", is_flag=True, help="Separate prefill and decode workers.")
@click.option("--prefill-replicas", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--secret", help="Secret whose keys become worker env vars (e.g. HF_TOKEN).")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Output folder.")
@replace_option
def dynamo_command(
    *,
    spec_path: Path | None,
    engines_root: Path,
    routing_file: Path | None,
    baseline_only: bool,
    spec_name: str | None,
    configs: tuple[str, ...],
    model: str | None,
    model_pvc: str | None,
    model_root: str | None,
    image: str | None,
    namespace: str,
    gpus_per_node: int,
    replicas: int,
    disaggregated: bool,
    prefill_replicas: int,
    secret: str | None,
    out: Path,
    force: bool,
) -> None:
    """Write one DynamoGraphDeployment per promoted variant (and the baseline)."""
    from trtspec.artifacts.routing import load_routing
    from trtspec.deploy import dynamo
    from trtspec.deploy.k8s import write
    from trtspec.deploy.options import Manifests
    from trtspec.deploy.sizing import DeployError

    parsed: dict[str, Any] = {}
    if spec_path is not None:
        name, parsed, target = _spec_configs(spec_path, engines_root)
        spec_name, model = spec_name or name, model or target
    parsed.update(dict(_engine_config(item) for item in configs))
    if not parsed or spec_name is None or model is None:
        raise click.UsageError(
            "give an LLM-API spec (--spec), or --spec-name, --model and one --engine-config "
            "per variant"
        )
    caps: dict[str, int] = {}
    if routing_file is not None:
        keep, caps = dynamo.promoted(load_routing(routing_file), list(parsed), str(routing_file))
        parsed = {v: parsed[v] for v in keep if v in parsed}
    elif spec_path is not None and len(parsed) > 1:
        if not baseline_only:
            raise DeployError(
                f"{spec_path}: no routing table given, so which variants were promoted is unknown "
                f"(variants: {', '.join(sorted(parsed))})",
                "pass --routing routing.yaml (graphs for the promoted variants and the baseline), "
                "or --baseline-only",
            )
        parsed = {"baseline": parsed["baseline"]}
    opts = dynamo.DynamoOptions(
        model=model, image=image or dynamo.RUNTIME_IMAGE, namespace=namespace,
        gpus_per_node=gpus_per_node, replicas=replicas, disaggregated=disaggregated,
        prefill_replicas=prefill_replicas, secret=secret, model_pvc=model_pvc,
        model_root=model_root,
    )  # fmt: skip
    made = dynamo.graphs(spec_name, parsed, opts, max_concurrency=caps)
    files = {f"{variant}.yaml": docs for variant, docs in made.items()}
    summary = {"schema_version": 2, "spec": spec_name, "variants": sorted(parsed),
               "disaggregated": disaggregated, "files": sorted(files),
               "dynamo_release": dynamo.DYNAMO_RELEASE, "image": opts.image,
               "dynamo_tensorrt_llm": dynamo.DYNAMO_TRTLLM, "max_concurrency": caps,
               "graphs": {v: docs[1]["metadata"]["name"] for v, docs in made.items()}}  # fmt: skip
    write(out, Manifests(files, {}, summary), force=force)
    progress(f"Wrote {out}/ ({len(files)} graphs)")
    rows = [[v, made[v][1]["metadata"]["name"], str(out / f"{v}.yaml")] for v in sorted(made)]
    emit_table(["variant", "graph", "file"], rows)


COMMANDS: list[click.Command] = [deploy]
