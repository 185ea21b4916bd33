"""``trtspec repo --check``: validation of any Triton model repository that
follows trtspec's layout, including hand-edited ones. It reads only what is
on disk — each ``config.pbtxt`` (parsed as ``ModelConfig``), the callee names
BLS callers carry in their ``parameters``, engine folders' ``config.json``
and their files against the ``trtspec.json`` manifest, and the router's
routing table — and returns a list of problems, each naming the
file, so the CLI can print them all at once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import text_format

from trtspec.artifacts.repo_manifest import MANIFEST_NAME, ROUTING_FILE
from trtspec.artifacts.routing import load_routing
from trtspec.catalogue import DRAFT_LOOP_MODES, ENGINE_MODES, lookahead_max_draft_len
from trtspec.errors import RepoError
from trtspec.integrity import MANIFEST, rebuild_hint, verify_files
from trtspec.repo import configs
from trtspec.runtime.contract import (
    LOOKAHEAD_INPUTS,
    ORCHESTRATOR_INPUTS,
    ORCHESTRATOR_OUTPUTS,
    PERF_OUTPUTS,
)
from trtspec.runtime.speculate import DRAFT_SCHEDULES

# The in-engine speculative modes by the decoding_mode parameter that selects them.
DECODING_TO_MODE = {
    m.decoding_mode: m.name for m in ENGINE_MODES.values() if m.decoding_mode and m.name != "none"
}

PRE_SENDS = ("QUERY", "REQUEST_OUTPUT_LEN")
PRE_READS = ("INPUT_ID", "OUT_END_ID", "OUT_PAD_ID")
POST_SENDS = ("TOKENS_BATCH", "SEQUENCE_LENGTH")
POST_READS = ("OUTPUT",)
ENGINE_SENDS = (
    "input_ids",
    "input_lengths",
    "request_output_len",
    "streaming",
    "exclude_input_in_output",
    "end_id",
    "pad_id",
    "temperature",
    "runtime_top_k",
    "runtime_top_p",
)
ENGINE_READS = ("output_ids", "sequence_length")


@dataclass(frozen=True)
class Problem:
    path: Path
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


@dataclass
class _Model:
    name: str
    path: Path  # config.pbtxt
    config: Any

    @property
    def params(self) -> dict[str, str]:
        return configs.parameters_of(self.config)

    @property
    def decoupled(self) -> bool:
        return bool(self.config.model_transaction_policy.decoupled)

    def inputs(self) -> set[str]:
        return {t.name for t in self.config.input}

    def outputs(self) -> set[str]:
        return {t.name for t in self.config.output}


def _flag(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes")


class _Checker:
    def __init__(self, repo: Path) -> None:
        self.repo = repo
        self.problems: list[Problem] = []
        self.models: dict[str, _Model] = {}
        self.checked_engines: set[str] = set()

    def add(self, path: Path, message: str) -> None:
        self.problems.append(Problem(path, message))

    # -- loading -----------------------------------------------------------
    def load(self) -> None:
        for folder in sorted(p for p in self.repo.iterdir() if p.is_dir()):
            if folder.name.startswith("."):
                continue
            path = folder / "config.pbtxt"
            if not path.is_file():
                self.add(folder, "model folder has no config.pbtxt")
                continue
            text = path.read_text(encoding="utf-8")
            if "${" in text:
                self.add(path, "contains an unfilled ${…} template placeholder")
                continue
            try:
                config = text_format.Parse(text, configs.ModelConfig())
            except text_format.ParseError as exc:
                self.add(path, f"not a valid ModelConfig: {exc}")
                continue
            if config.name and config.name != folder.name:
                self.add(path, f"name {config.name!r} differs from its folder {folder.name!r}")
            if config.backend == "python" and not (folder / "1" / "model.py").is_file():
                self.add(folder / "1" / "model.py", "python model has no 1/model.py")
            self.models[folder.name] = _Model(folder.name, path, config)

    # -- helpers -----------------------------------------------------------
    def callee(self, caller: _Model, key: str) -> _Model | None:
        name = caller.params.get(key, "")
        if not name:
            self.add(caller.path, f"parameter {key} is missing")
            return None
        model = self.models.get(name)
        if model is None:
            self.add(caller.path, f"parameter {key}: model {name!r} does not exist in {self.repo}")
        return model

    def tensors(
        self,
        caller: _Model,
        callee: _Model,
        sends: tuple[str, ...] | list[str],
        reads: tuple[str, ...] | list[str],
    ) -> None:
        inputs, outputs = callee.inputs(), callee.outputs()
        for name in sends:
            if name not in inputs:
                self.add(
                    callee.path,
                    f"model {callee.name} has no input {name!r} ({caller.name} sends it)",
                )
        for name in reads:
            if name not in outputs:
                self.add(
                    callee.path,
                    f"model {callee.name} has no output {name!r} ({caller.name} reads it)",
                )

    def require_decoupled(self, model: _Model, wanted: bool, why: str) -> None:
        if model.decoupled != wanted:
            state = "decoupled" if model.decoupled else "not decoupled"
            fix = f"model_transaction_policy {{ decoupled: {'true' if wanted else 'false'} }}"
            self.add(model.path, f"{model.name} is {state} but {why}; set {fix}")

    # -- engines -----------------------------------------------------------
    def engine_folder(self, engine: _Model) -> dict[str, Any] | None:
        raw = engine.params.get("gpt_model_path", "")
        if not raw:
            self.add(engine.path, f"engine {engine.name} has no gpt_model_path parameter")
            return None
        folder = Path(raw) if Path(raw).is_absolute() else self.repo / raw
        if not folder.is_dir():
            self.add(
                engine.path,
                f"gpt_model_path {raw} does not exist (engine {engine.name} is not built)",
            )
            return None
        self.engine_files(engine, folder)
        try:
            return json.loads((folder / "config.json").read_text(encoding="utf-8"))
        except OSError:
            self.add(engine.path, f"gpt_model_path {raw} has no config.json")
        except ValueError as exc:
            self.add(folder / "config.json", f"not valid JSON: {exc}")
        return None

    def engine_files(self, engine: _Model, folder: Path) -> None:
        """The engine folder's files against its build manifest, when it has one."""
        try:
            manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return  # not built by trtspec: nothing recorded to compare with
        if not isinstance(manifest, dict):
            return
        for rel, why in verify_files(folder, manifest) or []:
            self.add(
                folder / rel,
                f"{why} (engine {engine.name}; recorded in "
                f"{folder / MANIFEST}); {rebuild_hint(manifest)}",
            )

    def check_engine(
        self, engine: _Model, expected_mode: str | None, max_draft_len: int | None
    ) -> None:
        self.checked_engines.add(engine.name)
        data = self.engine_folder(engine)
        decoding = engine.params.get("decoding_mode", "")
        mode = expected_mode or DECODING_TO_MODE.get(decoding)
        if data is None:
            return
        build = data.get("build_config") or {}
        actual_int = build.get("speculative_decoding_mode")
        engine_draft = int(build.get("max_draft_len") or 0)
        raw = engine.params["gpt_model_path"]
        config_json = (Path(raw) if Path(raw).is_absolute() else self.repo / raw) / "config.json"
        expected_int = ENGINE_MODES[mode].trtllm_int if mode is not None else None
        if expected_int is not None and actual_int is not None and int(actual_int) != expected_int:
            self.add(
                engine.path,
                f"engine {engine.name} is served as {mode} but {config_json} has "
                f"speculative_decoding_mode {actual_int} (expected {expected_int})",
            )
        if max_draft_len is not None and max_draft_len > engine_draft:
            self.add(
                engine.path,
                f"engine {engine.name} was built with max_draft_len {engine_draft}, "
                f"less than the {max_draft_len} its caller drafts",
            )
        if mode == "lookahead":
            try:
                w, n, g = (int(engine.params[k]) for k in LOOKAHEAD_INPUTS)
            except (KeyError, ValueError):
                self.add(
                    engine.path,
                    "lookahead engine needs integer parameters " + ", ".join(LOOKAHEAD_INPUTS),
                )
                return
            derived = lookahead_max_draft_len(w, n, g)
            if derived != engine_draft:
                self.add(
                    engine.path,
                    f"lookahead (W={w}, N={n}, G={g}) needs max_draft_len {derived}, "
                    f"engine {engine.name} has {engine_draft}",
                )

    # -- orchestrators and router -----------------------------------------
    def check_orchestrator(self, model: _Model) -> None:
        params = model.params
        mode = params.get("mode", "none")
        self.require_decoupled(model, True, "an orchestrator streams through a response sender")
        self.tensors(
            model,
            model,
            [t.name for t in ORCHESTRATOR_INPUTS],
            [t.name for t in ORCHESTRATOR_OUTPUTS],
        )
        pre = self.callee(model, "preprocessing_model")
        if pre is not None:
            self.tensors(model, pre, PRE_SENDS, PRE_READS)
            self.require_decoupled(pre, False, f"{model.name} calls it with exec()")
        post = self.callee(model, "postprocessing_model")
        if post is not None:
            self.tensors(model, post, POST_SENDS, POST_READS)
            self.require_decoupled(post, False, f"{model.name} calls it with exec()")
        perf = _flag(params.get("perf_metrics", "false"))
        sends = [*ENGINE_SENDS, params.get("seed_input") or "seed"]
        reads = list(ENGINE_READS)
        reuse_input = params.get("reuse_stats_input") or ("return_perf_metrics" if perf else "")
        if reuse_input:
            sends.append(reuse_input)
            reads.append("kv_cache_reused_blocks")
        if perf:
            reads += [n for n in PERF_OUTPUTS if n.startswith("total_")]
        target = self.callee(model, "target_model")
        loop = mode in DRAFT_LOOP_MODES
        try:
            max_draft_len = int(params.get("max_draft_len") or 0) if loop else None
        except ValueError:
            self.add(model.path, "parameter max_draft_len is not an integer")
            max_draft_len = None
        schedule = params.get("draft_schedule") or "constant"
        if loop and schedule not in DRAFT_SCHEDULES:
            self.add(
                model.path,
                f"parameter draft_schedule {schedule!r} is not one of "
                + ", ".join(DRAFT_SCHEDULES),
            )
        if loop and schedule == "confidence" and mode != "draft_model":
            self.add(
                model.path,
                f"parameter draft_schedule 'confidence' reads a draft model's "
                f"probabilities; mode {mode} has none (use constant or adaptive)",
            )
        interval = params.get("stream_interval")
        if interval is not None and not (interval.strip().isdigit() and int(interval) >= 1):
            self.add(
                model.path,
                f"parameter stream_interval {interval!r} is not a positive integer "
                "(the spec's flow.stream_interval; absent = 1)",
            )
        threshold = params.get("draft_confidence_threshold")
        if loop and threshold and not _fraction(threshold):
            self.add(
                model.path,
                f"parameter draft_confidence_threshold {threshold!r} is not a number "
                "between 0 and 1 (exclusive)",
            )
        if target is not None:
            self.tensors(model, target, [*sends, "draft_input_ids"] if loop else sends, reads)
            if loop:
                self.require_decoupled(
                    target, False, f"{model.name} calls it in a draft loop with exec()"
                )
                self.check_engine(target, "draft_tokens_external", max_draft_len)
            else:
                self.require_decoupled(target, True, f"{model.name} streams from it")
                self.check_engine(target, None if mode == "none" else mode, None)
        if mode == "draft_model":
            draft = self.callee(model, "draft_model")
            if draft is not None:
                self.tensors(model, draft, sends, reads)
                self.require_decoupled(
                    draft, False, f"{model.name} calls it in a draft loop with exec()"
                )
                self.check_engine(draft, "none", None)

    def check_router(self, model: _Model) -> None:
        self.require_decoupled(model, True, "the router streams through a response sender")
        variants = [v for v in model.params.get("variants", "").split(",") if v]
        if not variants:
            self.add(model.path, "parameter variants is missing or empty")
        for name in variants:
            callee = self.models.get(name)
            if callee is None:
                self.add(model.path, f"parameter variants: model {name!r} does not exist")
                continue
            self.tensors(
                model,
                callee,
                [t.name for t in ORCHESTRATOR_INPUTS],
                [t.name for t in ORCHESTRATOR_OUTPUTS],
            )
        routing_path = model.path.parent / (model.params.get("routing_file") or ROUTING_FILE)
        try:
            table = load_routing(routing_path)
        except RepoError as exc:
            self.add(routing_path, exc.message.removeprefix(f"{routing_path}: "))
            return
        for name in sorted(table.variants()):
            if name not in variants:
                self.add(
                    routing_path,
                    f"routes to variant {name!r}, which the router's variants do not list",
                )

    def run(self) -> list[Problem]:
        if not self.repo.is_dir():
            return [Problem(self.repo, "repository folder does not exist")]
        nested = sorted(p for p in self.repo.glob("*/trtspec-repo.json"))
        if nested and not any(self.repo.glob("*/config.pbtxt")):
            return [
                Problem(
                    self.repo,
                    "holds repositories, not models; check "
                    + " or ".join(str(p.parent) for p in nested),
                )
            ]
        self.load()
        if not self.models and not self.problems:
            self.add(self.repo, "no model folders (folders with a config.pbtxt) found")
        for model in self.models.values():
            params = model.params
            if "target_model" in params:
                self.check_orchestrator(model)
            elif "routing_file" in params or "variants" in params:
                self.check_router(model)
        # Engines no orchestrator calls still have to point at a built engine.
        for model in self.models.values():
            if model.name not in self.checked_engines and (
                model.config.backend == "tensorrtllm" or "gpt_model_path" in model.params
            ):
                self.check_engine(model, None, None)
        manifest = self.repo / MANIFEST_NAME
        if manifest.is_file():
            try:
                listed = json.loads(manifest.read_text(encoding="utf-8")).get("models", {})
            except ValueError as exc:
                self.add(manifest, f"not valid JSON: {exc}")
                listed = {}
            for name in sorted(listed):
                if name not in self.models:
                    self.add(manifest, f"lists model {name!r}, which has no folder")
        unique: dict[tuple[str, str], Problem] = {}
        for problem in self.problems:
            unique.setdefault((str(problem.path), problem.message), problem)
        return list(unique.values())


def check_repository(path: Path) -> list[Problem]:
    """Every problem found in the repository at ``path`` (empty when valid)."""
    return _Checker(Path(path)).run()


def _fraction(text: str) -> bool:
    """Whether ``text`` is a number strictly between 0 and 1."""
    try:
        return 0.0 < float(text) < 1.0
    except ValueError:
        return False
