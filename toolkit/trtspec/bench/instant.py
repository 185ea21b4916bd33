"""Swap a repository's engines for the instant engine, for benchmarking only.

``use_instant_engines(repo, step_ms)`` takes a repository ``trtspec repo``
assembled and points every engine model (role ``engine`` in its
``trtspec-repo.json``) at ``trtspec.runtime.engine.instant_model`` with the config
parameter ``instant_step_ms``, keeping each config's tensors, batching and
decoupled policy. The product's assembly never calls it; the ceiling
benchmark (``benchmarks/ceiling.py``) does, to measure what the router,
orchestrators and text models cost when the engine costs nothing (or a fixed
GPU-like step). ``write_engine_stub(folder, tokenizer_dir)`` writes the
engine folder such a repository needs (``config.json`` with the tokenizer's
vocabulary size, and ``tokenizer/``) without building weights.
``use_instant_llm`` and ``instant_llmapi_repository`` do the same for the
LLM-API flow: its ``llmapi`` models become ``trtspec.runtime.engine.instant_llmapi``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from trtspec.errors import RepoError
from trtspec.fsutil import atomic_write_text
from trtspec.repo import configs
from trtspec.repo.assemble import MANIFEST_NAME, _model_py

INSTANT_MODULE = "trtspec.runtime.engine.instant_model"
INSTANT_LLM_MODULE = "trtspec.runtime.engine.instant_llmapi"
STEP_PARAMETER = "instant_step_ms"  # read by trtspec.runtime.engine.instant_model


def engine_models(repo: Path, role: str = "engine") -> list[str]:
    """The models of ``role`` (``engine``; ``llmapi`` in the LLM-API flow)
    named in ``repo``'s manifest."""
    path = Path(repo) / MANIFEST_NAME
    if not path.is_file():
        raise RepoError(f"{path}: not found", "Pass a folder `trtspec repo` wrote.")
    models = json.loads(path.read_text(encoding="utf-8")).get("models", {})
    return sorted(name for name, info in models.items() if info.get("role") == role)


def use_instant_engines(repo: Path, step_ms: float) -> list[str]:
    """Point every engine model of ``repo`` at the instant engine stepping every
    ``step_ms`` milliseconds (0: as fast as it can); returns their names."""
    return _use_instant(repo, step_ms, "engine", INSTANT_MODULE)


def use_instant_llm(repo: Path, step_ms: float) -> list[str]:
    """Point every ``llmapi`` model of an LLM-API flow ``repo`` at the instant
    LLM (its ``model.yaml``, ``stream_interval`` included, stays as written);
    returns their names."""
    return _use_instant(repo, step_ms, "llmapi", INSTANT_LLM_MODULE)


def _use_instant(repo: Path, step_ms: float, role: str, module: str) -> list[str]:
    if step_ms < 0:
        raise RepoError(
            f"instant engine step {step_ms} ms is negative", "Pass a step of 0 ms or more."
        )
    repo = Path(repo)
    names = engine_models(repo, role)
    if not names:
        raise RepoError(f"{repo}: no {role} model in its manifest", "Pass a matching repository.")
    for name in names:
        config_path = repo / name / "config.pbtxt"
        config = configs.read_config(config_path)
        if config.backend != "python":
            config.backend = "python"
        configs.set_parameters(config, {STEP_PARAMETER: f"{step_ms:g}"})
        configs.write_config(config_path, config)
        (repo / name / "1").mkdir(parents=True, exist_ok=True)
        atomic_write_text(repo / name / "1" / "model.py", _model_py(module))
    return names


def write_engine_stub(folder: Path, tokenizer_dir: Path) -> Path:
    """An engine folder the repository builder accepts, with no weights:
    ``config.json`` (``vocab_size`` from the tokenizer) and ``tokenizer/``."""
    from tokenizers import Tokenizer

    folder = Path(folder)
    tokenizer = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "tokenizer"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(tokenizer_dir, target)
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    atomic_write_text(
        folder / "config.json",
        json.dumps({"instant_engine": True, "vocab_size": vocab}, indent=2) + "\n",
    )
    return folder


INSTANT_SPEC = """\
name: {name}
backend: reference
flow: {{kind: engine, stream_interval: {interval}}}
target: {{model: {model}, family: llama, dtype: float32, max_batch_size: {batch},
         max_input_len: 1024, max_seq_len: 2048, max_num_tokens: 8192}}
variants:
  - {{name: draft, mode: draft_model, draft: {{model: {model}, family: llama}},
     max_draft_len: 4, num_draft_tokens: [3]}}
  - {{name: ngram, mode: ngram, max_draft_len: 4, max_matching_ngram_size: 2}}
rollout: {{canary_percent: 100, fallback_variant: baseline}}
router: {{instances: {instances}}}
"""


def instant_repository(
    root: Path,
    model: Path,
    step_ms: float,
    *,
    max_batch_size: int = 128,
    name: str = "instant",
    stream_interval: int = 1,
    router_instances: int = 1,
) -> Path:
    """Assemble, under ``root``, a repository of ``baseline``, a ``draft``
    (draft_model, k=3) and an ``ngram`` variant whose engines are all the
    instant engine; ``model`` is a Hugging Face folder whose tokenizer the
    text models load (no weights are read); ``stream_interval`` is the
    spec's ``flow.stream_interval``, ``router_instances`` its
    ``router.instances``. Returns the repository folder."""
    from trtspec.artifacts.plan import save_plan
    from trtspec.plan import make_plan
    from trtspec.repo.assemble import assemble
    from trtspec.spec import load_spec

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    spec_path = root / f"{name}.yaml"
    spec_path.write_text(
        INSTANT_SPEC.format(
            name=name,
            model=Path(model).resolve(),
            batch=max_batch_size,
            interval=int(stream_interval),
            instances=int(router_instances),
        ),
        encoding="utf-8",
    )
    spec = load_spec(spec_path)
    plan = make_plan(spec, root / "engines")
    for engine in plan.engines:
        write_engine_stub(root / "engines" / spec.name / engine.name, Path(model))
    save_plan(spec, plan)  # the instant engines' build, as `trtspec build` records one
    repo = assemble(spec, plan, root / "engines", root / "triton_repo")
    use_instant_engines(repo, step_ms)
    in_process_router(repo)
    add_bls_router(repo)
    return repo


def in_process_router(repo: Path) -> None:
    """Turn on ``in_process_variants`` for ``repo``'s router (what ``trtspec
    repo`` writes too; set here so the ceiling benchmark's ``full`` layer
    measures that path whatever a repository says)."""
    from trtspec.runtime.models.inprocess import PARAMETER

    path = Path(repo) / "router" / "config.pbtxt"
    config = configs.read_config(path)
    configs.set_parameters(config, {PARAMETER: True})
    configs.write_config(path, config)


BLS_ROUTER = "router_bls"


def add_bls_router(repo: Path) -> str:
    """A copy of ``repo``'s router named ``router_bls`` with
    ``in_process_variants: false``: the router that calls the variant's
    orchestrator model over BLS (the path before trtspec.runtime.models.inprocess),
    so one server measures both."""
    from trtspec.runtime.models.inprocess import PARAMETER

    repo = Path(repo)
    target = repo / BLS_ROUTER
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(repo / "router", target)
    config = configs.read_config(target / "config.pbtxt")
    config.name = BLS_ROUTER
    configs.set_parameters(config, {PARAMETER: False})
    configs.write_config(target / "config.pbtxt", config)
    return BLS_ROUTER


RELAY = "relay"

# The bare relay: one BLS call per request on a pooled thread, every response
# passed on as it came; what a Python router cannot avoid on this platform.
RELAY_SOURCE = '''\
"""Benchmark relay (trtspec.bench.instant, for benchmarks/ceiling.py): passes
each request to the model named by the parameter ``relay_to`` over decoupled
BLS and every response back, with nothing else in between."""
import json
from concurrent.futures import ThreadPoolExecutor

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.to = config["parameters"]["relay_to"]["string_value"]
        self.pool = ThreadPoolExecutor(max_workers=512)

    def execute(self, requests):
        for request in requests:
            self.pool.submit(self.relay, request)

    def relay(self, request):
        sender = request.get_response_sender()
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        try:
            call = pb_utils.InferenceRequest(
                model_name=self.to,
                inputs=[pb_utils.Tensor(t.name(), t.as_numpy()) for t in request.inputs()],
                requested_output_names=list(request.requested_output_names()),
            )
            for response in call.exec(decoupled=True):
                if response.has_error():
                    sender.send(pb_utils.InferenceResponse(error=response.error()), flags=final)
                    return
                tensors = response.output_tensors()
                if tensors:
                    sender.send(pb_utils.InferenceResponse(output_tensors=tensors))
            sender.send(flags=final)
        except Exception as exc:
            error = pb_utils.TritonError(f"relay: {exc}")
            sender.send(pb_utils.InferenceResponse(error=error), flags=final)

    def finalize(self):
        self.pool.shutdown(wait=False)
'''


def add_relay(repo: Path, engine_model: str) -> str:
    """``relay`` in ``repo``: ``engine_model``'s config (its tensors, its
    decoupled policy) served by ``RELAY_SOURCE`` relaying to it; the floor of
    any Python router, which ``benchmarks/ceiling.py`` measures beside the
    router (``add_bls_router``)."""
    folder = Path(repo) / RELAY
    (folder / "1").mkdir(parents=True, exist_ok=True)
    config = configs.read_config(Path(repo) / engine_model / "config.pbtxt")
    config.name = RELAY
    config.backend = "python"
    config.ClearField("parameters")
    for tensor in [*config.input, *config.output]:
        tensor.ClearField("reshape")  # it passes tensors on as the client sent them
    configs.set_parameters(config, {"relay_to": engine_model})
    configs.write_config(folder / "config.pbtxt", config)
    (folder / "1" / "model.py").write_text(RELAY_SOURCE, encoding="utf-8")
    return RELAY


INSTANT_LLMAPI_SPEC = """\
name: {name}
backend: reference
flow: {{kind: llmapi, trtllm_version: "1.2.1", llm_args: {{stream_interval: {interval}}}}}
target: {{model: {model}, family: llama, dtype: float32, max_batch_size: {batch},
         max_input_len: 1024, max_seq_len: 2048, max_num_tokens: 8192}}
variants: []
rollout: {{canary_percent: 100, fallback_variant: baseline}}
router: {{instances: {instances}}}
"""


def instant_llmapi_repository(
    root: Path,
    model: Path,
    step_ms: float,
    *,
    stream_interval: int = 1,
    max_batch_size: int = 128,
    name: str = "instant-llmapi",
    router_instances: int = 1,
) -> Path:
    """Assemble, under ``root``, a baseline-only ``flow: llmapi`` repository
    (``stream_interval`` as the LLM argument) whose ``baseline__llmapi``
    model is the instant LLM, plus the ``router_bls`` router; ``model`` is a
    Hugging Face folder whose tokenizer is used (no weights are read)."""
    from trtspec.artifacts.plan import save_plan
    from trtspec.flows import flow_for, make_plan
    from trtspec.spec import load_spec

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    spec_path = root / f"{name}.yaml"
    spec_path.write_text(
        INSTANT_LLMAPI_SPEC.format(
            name=name,
            model=Path(model).resolve(),
            batch=max_batch_size,
            interval=stream_interval,
            instances=int(router_instances),
        ),
        encoding="utf-8",
    )
    spec = load_spec(spec_path)
    flow = flow_for(spec)
    engines = root / "engines"
    plan = make_plan(spec, engines)
    for engine in plan.engines:
        write_engine_stub(engines / spec.name / engine.name, Path(model))
    flow.write_files(flow.files(spec, plan, engines))
    save_plan(spec, plan)
    repo = flow.assemble(spec, plan, engines, root / "triton_repo", routing=None, memory=None)
    use_instant_llm(repo, step_ms)
    in_process_router(repo)
    add_bls_router(repo)
    return repo
