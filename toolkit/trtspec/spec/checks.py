"""Turns pydantic errors into located, fix-bearing messages and runs the
cross-field rules TensorRT-LLM only enforces late: version range, beam width,
lookahead/EAGLE/Medusa limits, draft lengths, draft/target vocabulary (with a
chat-template mismatch warning), missing local paths, route files."""

from __future__ import annotations

import difflib
import hashlib
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from trtspec.catalogue import BASELINE
from trtspec.modes.draft_model import DraftModel
from trtspec.spec.external import check_external
from trtspec.spec.flows import EngineFlowSpec, LlmApiFlowSpec
from trtspec.spec.schema import (
    MODES,
    RESERVED_NAMES,
    Backend,
    Bench,
    Decision,
    ExternalArm,
    KvCache,
    ModelLocation,
    Objectives,
    Quantization,
    Rollout,
    RolloutLog,
    Route,
    Router,
    Spec,
    Stack,
    Target,
)
from trtspec.spec.yamlmarks import Path_, format_path
from trtspec.trtllm_argv import tp_split_problem
from trtspec.versions import MAX_TRTLLM_EXCLUSIVE, MIN_TRTLLM, parse_version, shipped_by

_FLOWS: dict[str, type[BaseModel]] = {"engine": EngineFlowSpec, "llmapi": LlmApiFlowSpec}
_SECTIONS: dict[tuple[str, ...], type[BaseModel]] = {
    (): Spec,
    ("stack",): Stack,
    ("target",): Target,
    ("target", "kv_cache"): KvCache,
    ("variants", "*", "draft"): DraftModel,
    ("routes", "*"): Route,
    ("bench",): Bench,
    ("bench", "decision"): Decision,
    ("bench", "decision", "objectives"): Objectives,
    ("bench", "external", "*"): ExternalArm,
    ("rollout",): Rollout,
    ("rollout", "log"): RolloutLog,
    ("router",): Router,
}


class _Issues:
    """Collects problems, each placed at the line/column of the offending field."""

    def __init__(self, filename: str, marks: dict[Path_, tuple[int, int]]) -> None:
        self.filename = filename
        self.marks = marks
        self.lines: list[str] = []

    def where(self, path: Path_, key: bool = False) -> str:
        probe = path
        if key and ("__key__", *path) in self.marks:
            line, col = self.marks[("__key__", *path)]
            return f"{self.filename}:{line}:{col}"
        while probe not in self.marks and probe:
            probe = probe[:-1]
        line, col = self.marks.get(probe, (1, 1))
        return f"{self.filename}:{line}:{col}"

    def add(self, path: Path_, message: str, key: bool = False) -> None:
        self.lines.append(f"{self.where(path, key)}: {format_path(path)}: {message}")

    def in_file_order(self) -> list[str]:
        """Problems sorted by line and column, so they read top to bottom."""

        def position(text: str) -> tuple[int, int]:
            rest = text[len(self.filename) + 1 :].split(":", 2)
            try:
                return int(rest[0]), int(rest[1])
            except (ValueError, IndexError):
                return 0, 0

        return sorted(self.lines, key=position)


def _model_at(path: Path_, data: Any) -> type[BaseModel] | None:
    norm: list[str] = []
    node: Any = data
    for i, part in enumerate(path):
        if (path[0] in ("variants", "routes") and i == 1) or (
            path[:2] == ("bench", "external") and i == 2
        ):
            norm.append("*")
        else:
            norm.append(str(part))
        node = node[part] if isinstance(node, dict | list) and _has(node, part) else None  # type: ignore[index]
    if len(norm) == 2 and norm[0] == "variants" and isinstance(node, dict):
        return MODES.get(str(node.get("mode")))
    if norm == ["flow"] and isinstance(node, dict):
        return _FLOWS.get(str(node.get("kind", "engine")))
    return _SECTIONS.get(tuple(norm))


def _has(node: Any, part: Any) -> bool:
    if isinstance(node, dict):
        return part in node
    return isinstance(part, int) and 0 <= part < len(node)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# Strict types (the schema does not coerce): what a field wanted, by error type.
_STRICT_TYPES = {
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "string_type": "a string",
}


def _yaml_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    return (
        "a list"
        if isinstance(value, list)
        else "a mapping"
        if isinstance(value, dict)
        else (type(value).__name__)
    )


def _unquoted_would_do(value: Any, kind: str) -> bool:
    """Whether ``value`` is a quoted string that, unquoted, has the wanted type."""
    if not isinstance(value, str) or kind == "string_type":
        return False
    try:
        loaded = yaml.safe_load(value) if len(value) < 100 else None
    except yaml.YAMLError:
        return False
    if kind == "bool_type":
        return isinstance(loaded, bool)
    wanted: tuple[type, ...] = (int,) if kind == "int_type" else (int, float)
    return isinstance(loaded, wanted) and not isinstance(loaded, bool)


def _pydantic_issues(exc: ValidationError, data: Any, issues: _Issues) -> None:
    for err in exc.errors(include_url=False):
        loc: list[Any] = list(err["loc"])
        # Discriminated unions put the tag in the location: variants.1.ngram.x.
        if len(loc) >= 3 and loc[0] == "variants" and loc[2] in MODES:
            del loc[2]
        if len(loc) >= 2 and loc[0] == "flow" and loc[1] in _FLOWS:  # flow.llmapi.x
            del loc[1]
        path = tuple(loc)
        kind = err["type"]
        if kind == "extra_forbidden":
            model = _model_at(path[:-1], data)
            known = list(model.model_fields) if model else []
            close = difflib.get_close_matches(str(path[-1]), known, n=1)
            fix = (
                f"did you mean {close[0]!r}?"
                if close
                else "remove it; allowed keys: " + ", ".join(known)
            )
            if model is LlmApiFlowSpec and path[-1] == "stream_interval":
                fix = "in the LLM-API flow it is an LLM argument: set flow.llm_args.stream_interval"
            issues.add(path, f"unknown key {path[-1]!r}; {fix}", key=True)
        elif kind == "missing":
            issues.add(path[:-1], f"missing required key {path[-1]!r}; add it", key=True)
        elif kind == "union_tag_not_found":
            issues.add(path, "missing key 'mode'; set mode to one of: " + ", ".join(MODES))
        elif kind == "union_tag_invalid":
            tag = err.get("ctx", {}).get("tag")
            close = difflib.get_close_matches(str(tag), list(MODES), n=1)
            fix = f"did you mean {close[0]!r}?" if close else "use one of: " + ", ".join(MODES)
            issues.add((*path, "mode"), f"unknown mode {tag!r}; {fix}")
        elif kind in {"enum", "literal_error"}:
            expected = err.get("ctx", {}).get("expected", "")
            issues.add(path, f"{_short(err.get('input'))} is not allowed; use one of {expected}")
        elif kind in _STRICT_TYPES:
            got = err.get("input")
            fix = "; remove the quotes" if _unquoted_would_do(got, kind) else ""
            issues.add(
                path, f"expected {_STRICT_TYPES[kind]}, got {_short(got)} ({_yaml_type(got)}){fix}"
            )
        elif kind in ("model_type", "model_attributes_type", "dict_type"):
            issues.add(path, f"expected a mapping, got {_short(err.get('input'))}")
        else:
            msg = err["msg"]
            msg = msg[0].lower() + msg[1:] if msg else msg
            issues.add(path, f"{msg} (got {_short(err.get('input'))})")


def _tree_problems(choices: list[list[int]]) -> str | None:
    seen = {tuple(c) for c in choices}
    if len(seen) != len(choices):
        return "contains a duplicate path; list each path once"
    for c in choices:
        if not c:
            return "contains an empty path; every path needs at least one index"
        if len(c) > 1 and tuple(c[:-1]) not in seen:
            return f"path {c} has no parent {c[:-1]}; add the parent path"
    return None


def _check(spec: Spec, issues: _Issues) -> list[str]:
    """The cross-field rules; returns the soft problems (warnings)."""
    warnings: list[str] = []
    ver = _check_stack(spec, issues, warnings)
    _check_target(spec, issues)
    names = _check_variants(spec, issues, warnings, ver)
    spec.flow.check_spec(spec, issues, warnings)
    for name, route in spec.routes.items():
        p = spec.resolve_path(route.prompts)
        if not p.is_file():
            issues.add(
                ("routes", name, "prompts"), f"file not found: {p}; create it or fix the path"
            )
    check_external(spec, names, issues)
    decision = spec.bench.decision
    if decision.decide_by == "goodput" and not (
        decision.objectives
        and any(v is not None for v in decision.objectives.model_dump().values())
    ):
        issues.add(
            ("bench", "decision", "decide_by"),
            "goodput needs latency objectives; set bench.decision.objectives "
            "(ttft_ms, itl_ms and/or latency_ms) or decide by speedup",
        )
    fb = spec.rollout.fallback_variant
    if fb != BASELINE and fb not in names:
        close = difflib.get_close_matches(fb, [BASELINE, *names], n=1)
        fix = f"did you mean {close[0]!r}?" if close else "use 'baseline' or a variant name"
        issues.add(("rollout", "fallback_variant"), f"no variant named {fb!r}; {fix}")
    return warnings


def _check_stack(spec: Spec, issues: _Issues, warnings: list[str]) -> tuple[int, int, int] | None:
    """The TensorRT-LLM version and its container; returns the parsed version."""
    ver = parse_version(spec.stack.trtllm_version)
    vpath = ("stack", "trtllm_version")
    if ver is None:
        issues.add(vpath, f'{spec.stack.trtllm_version!r} is not a version; write it like "1.1.0"')
    elif ver[:2] >= MAX_TRTLLM_EXCLUSIVE:
        issues.add(
            vpath,
            f"TensorRT-LLM {spec.stack.trtllm_version} is refused: the engine flow "
            "(convert_checkpoint.py + trtllm-build + the tensorrtllm Triton backend) was removed "
            "upstream in 1.3; pin a version below 1.3 (default 1.1.0)",
        )
    elif ver[:2] < MIN_TRTLLM:
        issues.add(
            vpath,
            f"TensorRT-LLM {spec.stack.trtllm_version} is refused: versions below 0.17 "
            "are not supported (different examples layout and speculative flags); "
            "use 0.17 or later",
        )
    image = spec.stack.triton_image
    if image is None:
        if ver and MIN_TRTLLM <= ver[:2] < MAX_TRTLLM_EXCLUSIVE:
            issues.add(
                vpath,
                f"no Triton container in trtspec's version table ships TensorRT-LLM "
                f"{spec.stack.trtllm_version}; set stack.triton_image to the image you build in",
            )
    else:
        shipped = shipped_by(image)
        if ver and shipped and parse_version(shipped) != ver:
            warnings.append(
                f"stack.triton_image {image} ships TensorRT-LLM {shipped}, "
                f"not {spec.stack.trtllm_version}"
            )
    return ver


def _check_target(spec: Spec, issues: _Issues) -> None:
    t = spec.target
    if t.max_input_len >= t.max_seq_len:
        issues.add(
            ("target", "max_seq_len"),
            f"must be greater than max_input_len ({t.max_input_len}); "
            f"raise max_seq_len or lower max_input_len",
        )
    if t.max_num_tokens < t.max_input_len:
        # Every engine model runs with enable_chunked_context false
        # (repo/assemble.py), and without chunking a context phase must fit in
        # max_num_tokens whole: MicroBatchScheduler stops scheduling at a
        # context whose tokens exceed what is left of it ("skip chunking" ...
        # ``batchNumTokens + reqNumTokens > maxNumTokensRuntime`` → break;
        # NVIDIA/TensorRT-LLM cpp/tensorrt_llm/batch_manager/
        # microBatchScheduler.cpp @0a949d31), so such a prompt never runs.
        issues.add(
            ("target", "max_num_tokens"),
            f"{t.max_num_tokens} is smaller than max_input_len ({t.max_input_len}); "
            "with chunked context off a prompt of max_input_len tokens could never be "
            f"scheduled: raise max_num_tokens to at least {t.max_input_len} or lower "
            "max_input_len",
        )
    if t.kv_cache.tokens_per_block & (t.kv_cache.tokens_per_block - 1):
        issues.add(
            ("target", "kv_cache", "tokens_per_block"),
            f"{t.kv_cache.tokens_per_block} is not a power of two; use 16, 32 or 64",
        )
    if spec.backend is Backend.reference:
        if t.tp * t.pp != 1:
            issues.add(
                ("target", "tp"), "the reference backend runs one process; set tp: 1 and pp: 1"
            )
        if t.quantization not in (Quantization.none, Quantization.int8):
            issues.add(
                ("target", "quantization"),
                f"{t.quantization.value!r} needs the tensorrt_llm backend; "
                "the reference backend supports none or int8",
            )
    else:
        if t.quantization is Quantization.int8:
            issues.add(
                ("target", "quantization"),
                "'int8' is the reference backend's dynamic int8; on "
                "tensorrt_llm use int8_wo (weight-only) or int8_sq (SmoothQuant)",
            )
        if t.instances > 1 and t.tp * t.pp > 1:
            # Instances are placed on GPUs of their own (plan.placement); a
            # single-engine repository of TP×PP > 1 runs in leader mode, where
            # the backend cannot place instances at all
            # (tensorrtllm_backend v0.19.0 docs/llama_multi_instance.md).
            issues.add(
                ("target", "instances"),
                f"{t.instances} instances of a tp×pp = {t.tp * t.pp} engine need one "
                "tritonserver per copy (TensorRT-LLM's leader mode cannot place instances); "
                "set instances: 1, or tp: 1 and pp: 1 for one GPU per instance",
            )
    _check_location(spec, t.model, ("target", "model"), issues)
    _check_tp_split(spec, t.model, t.tp, ("target", "tp"), issues, "the target")


def _check_variants(
    spec: Spec, issues: _Issues, warnings: list[str], ver: tuple[int, int, int] | None
) -> dict[str, int]:
    """Names, beam width and greedy-only temperatures here; each mode's own
    rules in its module (``trtspec.modes.<mode>.check``). Returns name -> index."""
    t = spec.target
    tools = _Tools(spec, issues, warnings, ver)
    names: dict[str, int] = {}
    for i, v in enumerate(spec.variants):
        base = ("variants", i)
        if v.name in names:
            issues.add(
                (*base, "name"),
                f"duplicate variant name {v.name!r} (also variants[{names[v.name]}]); "
                "give each variant a unique name",
            )
        names.setdefault(v.name, i)
        # draft_* engine names dodge variant names in the planner; target_* ones cannot.
        if v.name in RESERVED_NAMES or v.name.startswith("target_"):
            issues.add(
                (*base, "name"),
                f"{v.name!r} is reserved for trtspec's own models; pick another name",
            )
        if t.max_beam_width != 1:
            issues.add(
                ("target", "max_beam_width"),
                f"must be 1 with speculative variant {v.name!r} "
                f"(mode {v.mode}); TensorRT-LLM speculative decoding has no beam search",
            )
        # each mode's own rules, as the spec's serving flow sees them (trtspec.flows)
        spec.flow.check_variant(spec, v, base, tools)
    return names


def _check_location(
    spec: Spec, value: str, path: Path_, issues: _Issues, what: str = "model"
) -> ModelLocation:
    """``what`` is "model" (a Hugging Face folder, a .gguf file or a hub id) or
    the kind of checkpoint ("Medusa", "EAGLE": a folder with config.json)."""
    loc = spec.model_location(value)
    if loc.kind == "missing":
        issues.add(
            path,
            f"local path not found: {loc.ref}; fix the path (relative paths resolve "
            f"against {spec.base_dir}) or use a hub id like org/name",
        )
    elif loc.kind == "local" and not (Path(loc.ref) / "config.json").is_file():
        # /etc, a weights file, an empty folder: nothing a build could read.
        kind = "a folder" if Path(loc.ref).is_dir() else "a file"
        if what == "model":
            fix = (
                "point to a Hugging Face model folder (with config.json and the weights), "
                "a .gguf file, or use a hub id like org/name"
            )
        else:
            fix = f"point to the {what} checkpoint folder (with config.json and the weights)"
        noun = what if what == "model" else f"{what} checkpoint"
        article = "an" if noun[0] in "AEIOU" else "a"
        issues.add(path, f"{loc.ref} is {kind} without config.json, not {article} {noun}; {fix}")
    elif loc.kind == "gguf" and spec.backend is Backend.tensorrt_llm:
        issues.add(
            path, "a .gguf file can only feed the reference backend; point to a Hugging Face folder"
        )
    return loc


class _Tools:
    """What a mode's checks (``trtspec.modes.<mode>.check``) get from the checker."""

    def __init__(
        self,
        spec: Spec,
        issues: _Issues,
        warnings: list[str],
        trtllm_version: tuple[int, int, int] | None,
    ) -> None:
        self.spec, self.issues, self.warnings = spec, issues, warnings
        self.trtllm_version = trtllm_version

    def location(self, value: str, path: Path_, what: str = "model") -> ModelLocation:
        return _check_location(self.spec, value, path, self.issues, what)

    def tree_problem(self, choices: list[list[int]]) -> str | None:
        return _tree_problems(choices)

    def compare_vocab(self, target: Any, draft: Any, path: Path_, variant: str) -> None:
        _compare_vocab(Path(target), Path(draft), path, self.issues, self.warnings, variant=variant)

    def tp_split(self, model: str, tp: int, path: Path_, what: str, most: int = 64) -> None:
        _check_tp_split(self.spec, model, tp, path, self.issues, what, most)


def _check_tp_split(  # noqa: PLR0917 - internal helper, as _compare_vocab
    spec: Spec, model: str, tp: int, path: Path_, issues: _Issues, what: str, most: int = 64
) -> None:
    """A local model's heads against the TP it is converted with
    (``trtllm_argv.tp_split_problem``); hub models are checked by the build.
    The fix lists the TP sizes up to ``most`` that split."""
    loc = spec.model_location(model)
    if tp == 1 or loc.kind != "local" or spec.backend is not Backend.tensorrt_llm:
        return
    try:
        cfg = json.loads((Path(loc.ref) / "config.json").read_text(encoding="utf-8"))
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
    except (OSError, ValueError, KeyError, TypeError):
        return  # unreadable configs are reported where the model is located
    problem = tp_split_problem(heads, kv_heads, tp)
    if problem is not None:
        fits = [str(n) for n in range(1, most + 1) if not tp_split_problem(heads, kv_heads, n)]
        issues.add(
            path,
            f"{what} ({heads} heads, {kv_heads} KV heads) cannot be converted with tp {tp}: "
            f"{problem}; set tp to one of {', '.join(fits)}",
        )


# --------------------------------------------------------- draft vocabulary

_TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "tokenizer.model", "merges.txt")


def _vocab_identity(folder: Path) -> tuple[str, str] | None:
    """(file it came from, digest of the token->id mapping) or None when absent."""
    tj = folder / "tokenizer.json"
    if tj.is_file():
        try:
            data = json.loads(tj.read_text(encoding="utf-8"))
            model_vocab = data.get("model", {}).get("vocab")
            added = sorted((t.get("content"), t.get("id")) for t in data.get("added_tokens", []))
            blob = json.dumps(
                [model_vocab, added, data.get("model", {}).get("merges")], sort_keys=True
            )
            return "tokenizer.json", hashlib.sha256(blob.encode()).hexdigest()
        except (ValueError, AttributeError):
            return "tokenizer.json", hashlib.sha256(tj.read_bytes()).hexdigest()
    for name in _TOKENIZER_FILES[1:]:
        f = folder / name
        if f.is_file():
            return name, hashlib.sha256(f.read_bytes()).hexdigest()
    return None


def _vocab_size(folder: Path) -> int | None:
    try:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    size = cfg.get("vocab_size", cfg.get("text_config", {}).get("vocab_size"))
    return size if isinstance(size, int) else None


def has_chat_template(folder: Path) -> bool:
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    try:
        cfg = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return bool(cfg.get("chat_template"))


def _compare_vocab(
    target: Path, draft: Path, path: Path_, issues: _Issues, warnings: list[str], *, variant: str
) -> None:
    if not (target.is_dir() and draft.is_dir()):
        return
    tv, dv = _vocab_identity(target), _vocab_identity(draft)
    ts, ds = _vocab_size(target), _vocab_size(draft)
    if tv and dv:
        if tv[0] != dv[0] or tv[1] != dv[1]:
            issues.add(
                path,
                f"the draft's tokenizer ({dv[0]}) differs from the target's ({tv[0]}); "
                "draft and target must share a vocabulary: pick a draft from the target's "
                "model family",
            )
            return
        if ts is not None and ds is not None and ts != ds:
            warnings.append(
                f"variant {variant!r}: draft vocab_size {ds} != target vocab_size {ts}; the "
                "tokenizers are identical, so this is embedding padding and token ids agree"
            )
    elif ts is not None and ds is not None and ts != ds:
        issues.add(
            path,
            f"the draft's vocab_size {ds} differs from the target's {ts}; draft and target "
            "must share a vocabulary",
        )
    if has_chat_template(target) != has_chat_template(draft):
        which, other = ("target", "draft") if has_chat_template(target) else ("draft", "target")
        warnings.append(
            f"variant {variant!r}: the {which} has a chat template and the {other} does not "
            "(base vs instruct mismatch?); acceptance rates may be low"
        )
