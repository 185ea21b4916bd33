"""The Triton model repository of the LLM-API flow: per variant (and the
baseline) one ``llmapi``-contract model ``<variant>__llmapi`` in the layout
TensorRT-LLM's ``triton_backend/all_models/llmapi`` model expects
(``config.pbtxt`` + ``1/model.yaml`` + ``1/model.py``), the variant's public
model ``<variant>`` (``trtspec.runtime.models.llmapi_adapter``: the
orchestrator's tensors in front of it) and the shared ``router`` with its
routing table; plus the ``trtspec-repo.json`` manifest. On the reference
backend ``1/model.py`` loads ``trtspec.runtime.engine.llmapi_model``; on a GPU it
is upstream's model, copied from the container's TensorRT-LLM checkout
(``TRTLLM_LLMAPI_MODEL_DIR``, default ``/app/tensorrt_llm/triton_backend/
all_models/llmapi/tensorrt_llm/1``). Written into a staging folder and
swapped in by rename, like the engine flow's repository.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from tritonclient.grpc import model_config_pb2 as mc

from trtspec.artifacts.repo_manifest import MANIFEST_NAME, MANIFEST_SCHEMA_VERSION, ROUTING_FILE
from trtspec.artifacts.rollout_state import CONFIG_FILE as ROLLOUT_CONFIG_FILE
from trtspec.artifacts.routing import RoutingTable
from trtspec.catalogue import BASELINE
from trtspec.errors import RepoError
from trtspec.flows import llmapi_config as llmapi
from trtspec.fsutil import atomic_write_text
from trtspec.repo import configs
from trtspec.repo.assemble import (
    ROUTER,
    _model_py,
    install_repository,
    routed_table,
)
from trtspec.repo.rollout_config import rollout_config
from trtspec.runtime.contract import (
    LLMAPI_ACCEPTANCE_AVAILABLE,
    LLMAPI_ACCEPTANCE_OUTPUTS_PARAMETER,
    LLMAPI_VERSION_PARAMETER,
    ORCHESTRATOR_INPUTS,
    ORCHESTRATOR_OUTPUTS,
    TensorSpec,
)
from trtspec.vocab import Backend

if TYPE_CHECKING:
    from trtspec.memory import MemoryPlan
    from trtspec.plan import Plan
    from trtspec.spec import Spec

ADAPTER_MODULE = "trtspec.runtime.models.llmapi_adapter"
REFERENCE_MODULE = "trtspec.runtime.engine.llmapi_model"
DATA = Path(__file__).with_name("data")  # triton_llmapi_model.json
UPSTREAM_ENV = "TRTLLM_LLMAPI_MODEL_DIR"
UPSTREAM_DEFAULT = "/app/tensorrt_llm/triton_backend/all_models/llmapi/tensorrt_llm/1"
UPSTREAM_FILES = ("model.py", "helpers.py")


def contract() -> dict[str, Any]:
    """The llmapi model's tensors and facts (``data/triton_llmapi_model.json``)."""
    return json.loads((DATA / "triton_llmapi_model.json").read_text(encoding="utf-8"))


def acceptance_available(version: str) -> bool:
    return not contract()["acceptance_outputs_zeroed"][version]


def llm_config(spec: Spec, name: str) -> Any:
    """``config.pbtxt`` of ``<variant>__llmapi``: python backend, one CPU
    instance (the LLM runs on the GPUs it finds), the llmapi tensors, and
    ``max_batch_size`` / transaction policy equal to model.yaml's
    ``triton_config`` (upstream's auto-complete writes the same; stating them
    keeps the repository loadable with ``--disable-auto-complete-config``)."""
    data = contract()
    config = mc.ModelConfig()
    config.name = name
    config.backend = "python"
    config.max_batch_size = 0
    config.model_transaction_policy.decoupled = llmapi.settings(spec).decoupled
    configs.add_tensors(
        config,
        [TensorSpec(n, t, tuple(d), optional=o) for n, t, d, o in data["inputs"]],
        [TensorSpec(n, t, tuple(d)) for n, t, d in data["outputs"]],
    )
    group = config.instance_group.add()
    group.count = 1
    group.kind = mc.ModelInstanceGroup.Kind.Value("KIND_CPU")
    if spec.backend is Backend.reference:  # the stand-in acts as this version's model
        version = llmapi.settings(spec).trtllm_version
        config.parameters[LLMAPI_VERSION_PARAMETER].string_value = version
        outputs = "filled" if acceptance_available(version) else "zeroed"
        config.parameters[LLMAPI_ACCEPTANCE_OUTPUTS_PARAMETER].string_value = outputs
    return config


def _upstream_files() -> Path:
    folder = Path(os.environ.get(UPSTREAM_ENV, UPSTREAM_DEFAULT))
    missing = [f for f in UPSTREAM_FILES if not (folder / f).is_file()]
    if missing:
        raise RepoError(
            f"{folder}: TensorRT-LLM's llmapi Triton model ({', '.join(missing)}) not found",
            f"run `trtspec repo` inside the TensorRT-LLM container, or set {UPSTREAM_ENV} to "
            "triton_backend/all_models/llmapi/tensorrt_llm/1 of a TensorRT-LLM checkout",
        )
    return folder


def _draft_len(variant: Any) -> int:
    """A variant's draft length for the request log (0 = not speculative)."""
    if variant is None:
        return 0
    ks = getattr(variant, "num_draft_tokens", None)
    if isinstance(ks, list) and ks:
        return int(ks[0])
    return int(getattr(variant, "max_draft_len", 0) or 0)


def write_tree(
    spec: Spec,
    plan: Plan,
    repo: Path,
    routing: RoutingTable,
    golden: dict[str, list[str]] | None = None,
    *,
    memory: MemoryPlan | None = None,
) -> None:
    docs = llmapi.documents(spec, plan, routing, llmapi.kv_budgets(memory))
    reference = spec.backend is Backend.reference
    upstream = None if reference else _upstream_files()
    available = acceptance_available(llmapi.settings(spec).trtllm_version)
    models: dict[str, Any] = {}
    by_name = {v.name: v for v in spec.variants}
    for name, doc in docs.items():
        llm = llmapi.llm_model_name(name)
        configs.write_config(repo / llm / "config.pbtxt", llm_config(spec, llm))
        version = repo / llm / "1"
        version.mkdir(parents=True, exist_ok=True)
        atomic_write_text(version / "model.yaml", llmapi.dump(llmapi.model_yaml(spec, doc)))
        if upstream is None:
            (version / "model.py").write_text(_model_py(REFERENCE_MODULE), encoding="utf-8")
        else:
            for f in UPSTREAM_FILES:
                shutil.copyfile(upstream / f, version / f)
        tokenizer = Path(doc["model"]) / "tokenizer" if reference else doc["model"]
        adapter = configs.base_config(
            name,
            backend="python",
            max_batch_size=0,
            decoupled=True,
            inputs=ORCHESTRATOR_INPUTS,
            outputs=ORCHESTRATOR_OUTPUTS,
            parameters={
                "llm_model": llm,
                "tokenizer_dir": str(tokenizer),
                "acceptance": LLMAPI_ACCEPTANCE_AVAILABLE if available else "not_available",
            },
        )
        configs.write_config(repo / name / "config.pbtxt", adapter)
        (repo / name / "1").mkdir(parents=True, exist_ok=True)
        (repo / name / "1" / "model.py").write_text(_model_py(ADAPTER_MODULE), encoding="utf-8")
        v = by_name.get(name)
        mode = "none" if v is None else v.mode
        models[name] = {"role": "orchestrator", "calls": [llm], "variant": name, "mode": mode}
        models[llm] = {"role": "llmapi", "calls": [], "variant": None, "mode": mode}
    router = configs.base_config(
        ROUTER,
        backend="python",
        max_batch_size=0,
        decoupled=True,
        instances=int(spec.router.instances),  # as the engine flow's (assemble.py)
        inputs=ORCHESTRATOR_INPUTS,
        outputs=ORCHESTRATOR_OUTPUTS,
        parameters={
            "routing_file": ROUTING_FILE,
            "variants": ",".join(sorted(docs)),
            # the chosen variant's adapter runs in the router's process
            # (runtime/models/inprocess.py): router → llmapi model, one hop fewer
            "in_process_variants": True,
        },
    )
    configs.write_config(repo / ROUTER / "config.pbtxt", router)
    (repo / ROUTER / "1").mkdir(parents=True, exist_ok=True)
    (repo / ROUTER / "1" / "model.py").write_text(
        _model_py("trtspec.runtime.models.router"), encoding="utf-8"
    )
    (repo / ROUTER / ROUTING_FILE).write_text(
        json.dumps(routing.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    # the rollout's settings and golden set, as the engine flow's router gets them
    facts = {
        name: SimpleNamespace(
            mode=by_name[name].mode if name in by_name else "none",
            spec=by_name.get(name),
            num_draft_tokens=_draft_len(by_name.get(name)),
            max_draft_len=_draft_len(by_name.get(name)),
        )
        for name in docs
    }
    (repo / ROUTER / ROLLOUT_CONFIG_FILE).write_text(
        json.dumps(rollout_config(spec, facts, golden).to_dict(), indent=2, sort_keys=True) + "\n",
        encoding="utf-8",
    )
    models[ROUTER] = {"role": "router", "calls": sorted(docs), "variant": None, "mode": None}
    manifest = {
        "schema_version": MANIFEST_SCHEMA_VERSION,
        "spec": spec.name,
        "spec_hash": spec.spec_hash,
        "flow": "llmapi",
        "backend": spec.backend.value,
        "trtllm_version": llmapi.settings(spec).trtllm_version,
        "models": models,
        "variants": [*sorted(n for n in docs if n != BASELINE), BASELINE],
    }
    (repo / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def check_built(spec: Spec, plan: Plan) -> None:
    if spec.backend is not Backend.reference:
        return
    for engine in plan.engines:
        if not (Path(engine.dir) / "config.json").is_file():
            raise RepoError(
                f"{Path(engine.dir) / 'config.json'}: engine {engine.name} is not built",
                "Run `trtspec build` for this spec first, or pass --engines DIR.",
            )


def assemble(
    spec: Spec,
    plan: Plan,
    engines_root: Path,
    output: Path,
    routing: RoutingTable | None = None,
    *,
    golden: dict[str, list[str]] | None = None,
    memory: MemoryPlan | None = None,
) -> Path:
    """Write ``output/<spec.name>/`` for the LLM-API flow and return it;
    ``golden`` is each route's golden set for the router's golden diff;
    ``memory`` (the flow's memory plan, made once by the caller) gives each
    variant its KV budget when it was made with a GPU size."""
    check_built(spec, plan)
    table = routed_table(spec, routing, set(llmapi.variant_names(spec)))
    return install_repository(
        Path(output),
        spec.name,
        lambda staging: write_tree(spec, plan, staging, table, golden, memory=memory),
    )
