"""Spec -> build plan: which engines exist, which variant uses which engine, and
the ordered steps (argv, cwd, env, inputs, outputs, cache key) that produce
them. Pure: it reads file metadata to fingerprint local inputs but runs and
writes nothing.

Engines are shared where identical (docs/design/engines.md): ``target`` is the
baseline; every ``draft_model`` and ``ngram`` variant uses one ``target_dte``
built with the largest ``max_draft_len`` they need; each distinct draft model
(+quantization, dtype) is built once as ``draft_<slug>``; Medusa, EAGLE and
lookahead variants get their own target engine. Intermediate folders (hub
downloads under ``.sources/``, TRT-LLM checkpoints under ``.checkpoints/``)
are units of their own so a rebuild with new ``trtllm-build`` flags reuses a
converted checkpoint. Each step's cache key hashes its argv, env, tool
versions and the identity of its inputs (upstream units' keys, or a
size/mtime fingerprint of local folders), so an unchanged spec runs nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from trtspec import __version__, trtllm_argv
from trtspec.catalogue import BASELINE, DRAFT_LOOP_ENGINE, ENGINE_MODES, MODES, engine_mode
from trtspec.modes import module_for
from trtspec.modes.draft_model import draft_identity, loop_engine_target, needs_draft_logits
from trtspec.procutil import dist_version
from trtspec.spec import (
    DraftModelVariant,
    EagleVariant,
    Quantization,
    Spec,
)
from trtspec.versions import default_examples_dir


@dataclass(frozen=True)
class Step:
    """One subprocess. ``unit`` is the folder it writes into (staged by the executor)."""

    id: str
    kind: str  # download | convert | quantize | build | tokenizer | reference
    unit: str
    argv: tuple[str, ...]
    cwd: str | None
    env: dict[str, str]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    cache_key: str
    engine: str | None
    description: str

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["argv"] = list(self.argv)
        data["inputs"] = list(self.inputs)
        data["outputs"] = list(self.outputs)
        return data


@dataclass(frozen=True)
class EnginePlan:
    name: str
    role: str  # target | draft
    mode: str  # none | draft_tokens_external | medusa | eagle | lookahead_decoding
    max_draft_len: int
    source: str
    dir: Path
    variants: tuple[str, ...]
    # what trtllm-build makes of the spec's limits (trtllm_argv.effective_limits)
    max_seq_len: int = 0
    max_num_tokens: int = 0
    tp: int = 1
    pp: int = 1
    gather_logits: bool = False  # built with --gather_generation_logits
    num_eagle_layers: int = 0
    # GPU device ids per Triton instance (tensorrtllm ``gpu_device_ids``); () on reference
    devices: tuple[tuple[int, ...], ...] = ()

    @property
    def speculative_decoding_mode(self) -> int:
        return engine_mode(self.mode).trtllm_int

    @property
    def world(self) -> int:
        return self.tp * self.pp

    @property
    def gpu_device_ids(self) -> str:
        """The backend's format: commas between GPUs, ``;`` between instances."""
        return ";".join(",".join(str(d) for d in inst) for inst in self.devices)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": self.role,
            "mode": self.mode,
            "speculative_decoding_mode": self.speculative_decoding_mode,
            "max_draft_len": self.max_draft_len,
            "source": self.source,
            "dir": str(self.dir),
            "variants": list(self.variants),
            "max_seq_len": self.max_seq_len,
            "max_num_tokens": self.max_num_tokens,
            "tp": self.tp,
            "pp": self.pp,
            "gather_generation_logits": self.gather_logits,
            "devices": [list(d) for d in self.devices],
        }


@dataclass(frozen=True)
class VariantEngines:
    target: str
    draft: str | None
    mode: str  # the spec mode, or "none" for baseline


@dataclass
class Plan:
    spec_name: str
    spec_hash: str
    backend: str
    root: Path  # engines/<spec>
    engines: list[EnginePlan]
    steps: list[Step]
    variants: dict[str, VariantEngines]
    unit_keys: dict[str, str] = field(default_factory=dict)

    def engine(self, name: str) -> EnginePlan:
        for e in self.engines:
            if e.name == name:
                return e
        raise KeyError(name)

    @property
    def gpus(self) -> int:
        """GPUs the engines are placed on (every instance's, ``placement``); 0 on reference."""
        return max((d + 1 for e in self.engines for inst in e.devices for d in inst), default=0)

    def units(self) -> list[str]:
        """Output folders in build order."""
        seen: dict[str, None] = {}
        for s in self.steps:
            seen.setdefault(s.unit, None)
        return list(seen)

    def unit_steps(self, unit: str) -> list[Step]:
        return [s for s in self.steps if s.unit == unit]

    def units_for(self, variant: str) -> set[str]:
        """Every unit a variant's engines need, upstream folders included."""
        ve = self.variants[variant]
        wanted = {str(self.engine(ve.target).dir)}
        if ve.draft:
            wanted.add(str(self.engine(ve.draft).dir))
        produced = set(self.units())
        stack = list(wanted)
        while stack:
            unit = stack.pop()
            for s in self.unit_steps(unit):
                for inp in s.inputs:
                    if inp in produced and inp not in wanted:
                        wanted.add(inp)
                        stack.append(inp)
        return wanted

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec_name,
            "spec_hash": self.spec_hash,
            "backend": self.backend,
            "root": str(self.root),
            "engines": [e.to_dict() for e in self.engines],
            "variants": {k: asdict(v) for k, v in self.variants.items()},
            "steps": [s.to_dict() for s in self.steps],
        }


def plan_from_dict(data: dict[str, Any], spec_hash: str) -> Plan:
    """The ``Plan`` that ``trtspec.artifacts.plan`` wrote field by field
    (``read_plan``'s data); ``spec_hash`` is the spec it is read for."""

    engines = [
        EnginePlan(
            **{
                **e,
                "dir": Path(e["dir"]),
                "variants": tuple(e["variants"]),
                "devices": tuple(tuple(d) for d in e["devices"]),
            }
        )
        for e in data["engines"]
    ]
    steps = [
        Step(
            **{
                **s,
                "argv": tuple(s["argv"]),
                "inputs": tuple(s["inputs"]),
                "outputs": tuple(s["outputs"]),
            }
        )
        for s in data["steps"]
    ]
    return Plan(
        spec_name=data["spec_name"],
        spec_hash=spec_hash,
        backend=data["backend"],
        root=Path(data["root"]),
        engines=engines,
        steps=steps,
        variants={k: VariantEngines(**v) for k, v in data["variants"].items()},
        unit_keys=dict(data["unit_keys"]),
    )


def slug(text: str) -> str:
    base = text.rstrip("/").rsplit("/", 1)[-1]
    base = re.sub(r"\.gguf$", "", base)
    return re.sub(r"[^a-z0-9._-]+", "-", base.lower()).strip("-._") or "model"


def fingerprint(path: str) -> str:
    """Identity of a local input: file names, sizes and mtimes (cheap, no hashing of weights)."""
    p = Path(path)
    if not p.exists():
        return f"missing:{path}"
    if p.is_file():
        st = p.stat()
        return f"file:{st.st_size}:{st.st_mtime_ns}"
    h = hashlib.sha256()
    for root, dirs, files in os.walk(p):
        dirs.sort()
        for name in sorted(files):
            f = Path(root, name)
            try:
                st = f.stat()
            except OSError:
                continue
            h.update(f"{f.relative_to(p)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return "dir:" + h.hexdigest()


class _Builder:
    def __init__(self, spec: Spec, engines_root: Path, examples_dir: str | None) -> None:
        self.spec = spec
        self.root = Path(engines_root) / spec.name
        self.examples = (
            examples_dir
            or spec.stack.examples_dir
            or default_examples_dir(spec.stack.trtllm_version)
        )
        self.version = spec.stack.trtllm_version
        self.gpu = spec.backend.gpu
        self.steps: list[Step] = []
        self.unit_keys: dict[str, str] = {}
        self.engines: dict[str, EnginePlan] = {}
        self.external: dict[str, str] = {}  # input path -> identity (hub ids, local folders)
        self.drafts: dict[tuple[str, str, str, str], str] = {}  # draft_identity -> engine
        self.drafted: set[str] = set()  # draft engines whose steps are planned

    # -- keys -------------------------------------------------------------
    def _versions(self) -> dict[str, str]:
        if self.gpu:
            # The container's own versions are pinned by the spec's stack.
            return {"trtllm": self.version, "trtspec": __version__}
        return {
            "trtspec": __version__,
            "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
            "torch": dist_version("torch") or "absent",
            "transformers": dist_version("transformers") or "absent",
        }

    def _identity(self, inp: str) -> str:
        if inp in self.unit_keys:
            return "unit:" + self.unit_keys[inp]
        if inp in self.external:
            return self.external[inp]
        return fingerprint(inp)

    def add(
        self,
        *,
        kind: str,
        unit: Path,
        argv: list[str],
        inputs: list[str],
        engine: str | None,
        description: str,
        step_id: str,
    ) -> None:
        unit_s = str(unit)
        payload = {
            "kind": kind,
            "argv": argv,
            "env": {},
            "cwd": None,
            "inputs": {i: self._identity(i) for i in inputs},
            "versions": self._versions(),
        }
        key = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
        self.steps.append(
            Step(
                id=step_id,
                kind=kind,
                unit=unit_s,
                argv=tuple(argv),
                cwd=None,
                env={},
                inputs=tuple(inputs),
                outputs=(unit_s,),
                cache_key=key,
                engine=engine,
                description=description,
            )
        )
        keys = [s.cache_key for s in self.steps if s.unit == unit_s]
        self.unit_keys[unit_s] = hashlib.sha256("".join(keys).encode()).hexdigest()

    # -- sources ----------------------------------------------------------
    def source(self, ref: str) -> str:
        """A model reference as a local path, adding a download step for hub ids."""
        loc = self.spec.model_location(ref)
        if loc.kind != "hub":
            self.external.setdefault(loc.ref, fingerprint(loc.ref))
            return loc.ref
        unit = self.root / ".sources" / slug(loc.ref)
        if str(unit) not in self.unit_keys:
            self.external[loc.ref] = "hub:" + loc.ref
            self.add(
                kind="download",
                unit=unit,
                argv=trtllm_argv.download_argv(loc.ref, str(unit)),
                inputs=[loc.ref],
                engine=None,
                description=f"download {loc.ref}",
                step_id=f"download:{slug(loc.ref)}",
            )
        return str(unit)

    # -- engines ----------------------------------------------------------
    def engine(
        self,
        name: str,
        *,
        role: str,
        mode: str,
        max_draft_len: int,
        source: str,
        variant: str | None,
        tp: int | None = None,
        pp: int | None = None,
        gather_logits: bool = False,
        num_eagle_layers: int = 0,
    ) -> EnginePlan:
        """Add (or extend, for a shared engine) the plan of engine ``name``:
        a shared engine keeps gathering logits once any of its variants needs it."""
        t = self.spec.target
        prev = self.engines.get(name)
        variants = (
            (*prev.variants, variant)
            if prev and variant
            else (prev.variants if prev else ((variant,) if variant else ()))
        )
        limits = trtllm_argv.effective_limits(
            max_seq_len=t.max_seq_len,
            max_num_tokens=t.max_num_tokens,
            max_batch_size=t.max_batch_size,
            mode=mode,
            max_draft_len=max_draft_len,
            num_eagle_layers=num_eagle_layers,
        )
        e = EnginePlan(
            name=name,
            role=role,
            mode=mode,
            max_draft_len=max_draft_len,
            source=source,
            dir=self.root / name,
            variants=variants,
            max_seq_len=limits.max_seq_len,
            max_num_tokens=limits.max_num_tokens,
            tp=t.tp if tp is None else tp,
            pp=t.pp if pp is None else pp,
            gather_logits=gather_logits or bool(prev and prev.gather_logits),
            num_eagle_layers=num_eagle_layers,
        )
        self.engines[name] = e
        return e

    def checkpoint(self, name: str, kind: str, argv: list[str], inputs: list[str]) -> str:
        """A checkpoint unit (added once even when several engines share it)."""
        unit = self.ckpt_dir(name)
        if unit not in self.unit_keys:
            self.add(
                kind=kind,
                unit=Path(unit),
                argv=argv,
                inputs=inputs,
                engine=None,
                description=f"{kind} checkpoint {name}",
                step_id=f"{kind}:{name}",
            )
        return unit

    def ckpt_dir(self, name: str) -> str:
        return str(self.root / ".checkpoints" / name)

    def plain_checkpoint(
        self,
        name: str,
        src: str,
        family: Any,
        dtype: str,
        quant: Any,
        *,
        tp: int | None = None,
        pp: int | None = None,
    ) -> str:
        """Unquantized models go through convert_checkpoint.py, quantized through
        quantize.py; with the target's TP/PP unless told otherwise (a draft's own)."""
        t, out = self.spec.target, self.ckpt_dir(name)
        tp, pp = (t.tp if tp is None else tp), (t.pp if pp is None else pp)
        if quant is Quantization.none:
            argv = trtllm_argv.convert_argv(
                examples_dir=self.examples,
                version=self.version,
                family=family,
                source=src,
                output=out,
                dtype=dtype,
                tp=tp,
                pp=pp,
            )
            return self.checkpoint(name, "convert", argv, [src])
        argv = trtllm_argv.quantize_argv(
            examples_dir=self.examples,
            source=src,
            output=out,
            dtype=dtype,
            quantization=quant,
            tp=tp,
            pp=pp,
        )
        return self.checkpoint(name, "quantize", argv, [src])

    def target_checkpoint(self, src: str) -> str:
        t = self.spec.target
        return self.plain_checkpoint("target", src, t.family, self.spec.dtype, t.quantization)

    def engine_target(self, e: EnginePlan) -> Any:
        """The target shape ``e`` is built with: a draft loop's engines take
        the loop's input length (modes/draft_model.loop_engine_target)."""
        if e.name == DRAFT_LOOP_ENGINE or e.role == "draft":
            return loop_engine_target(self.spec.target)
        return self.spec.target

    def gpu_engine(  # noqa: PLR0917 - internal helper, called positionally in one module
        self,
        e: EnginePlan,
        ckpt: str,
        tokenizer_src: str | None,
        quantization: Any,
        dtype: str,
        gather_logits: bool = False,
    ) -> None:
        out = str(e.dir)
        argv = trtllm_argv.build_argv(
            checkpoint=ckpt,
            output=out,
            target=self.engine_target(e),
            dtype=dtype,
            quantization=quantization,
            mode=e.mode,
            max_draft_len=e.max_draft_len,
            gather_generation_logits=gather_logits or e.gather_logits,
        )
        self.add(
            kind="build",
            unit=e.dir,
            argv=argv,
            inputs=[ckpt],
            engine=e.name,
            description=f"trtllm-build {e.name}",
            step_id=f"build:{e.name}",
        )
        if tokenizer_src is not None:
            self.add(
                kind="tokenizer",
                unit=e.dir,
                argv=trtllm_argv.tokenizer_argv(tokenizer_src, f"{out}/tokenizer"),
                inputs=[tokenizer_src],
                engine=e.name,
                description=f"copy tokenizer into {e.name}",
                step_id=f"tokenizer:{e.name}",
            )

    def reference_engine(  # noqa: PLR0917 - internal helper, as gpu_engine
        self,
        e: EnginePlan,
        src: str,
        quantization: Any,
        dtype: str,
        extra: dict[str, Any],
        inputs: list[str],
    ) -> None:
        argv = trtllm_argv.reference_argv(
            source=src,
            output=str(e.dir),
            mode=e.mode,
            max_draft_len=e.max_draft_len,
            target=self.engine_target(e),
            dtype=dtype,
            quantization=quantization,
            **extra,
        )
        self.add(
            kind="reference",
            unit=e.dir,
            argv=argv,
            inputs=[src, *inputs],
            engine=e.name,
            description=f"reference engine {e.name}",
            step_id=f"reference:{e.name}",
        )


def make_plan(
    spec: Spec, engines_root: Path = Path("engines"), *, examples_dir: str | None = None
) -> Plan:
    """The ordered build plan for ``spec``; engines land in ``engines_root/<spec>/``."""
    b = _Builder(spec, engines_root, examples_dir)
    t = spec.target
    q, dtype = t.quantization, spec.dtype
    target_src = b.source(t.model)
    variants: dict[str, VariantEngines] = {BASELINE: VariantEngines("target", None, "none")}

    base = b.engine(
        "target", role="target", mode="none", max_draft_len=0, source=t.model, variant=BASELINE
    )
    dte_users = [v for v in spec.variants if MODES[v.mode].draft_loop]
    if dte_users:
        b.engine(
            DRAFT_LOOP_ENGINE,
            role="target",
            mode=ENGINE_MODES["draft_tokens_external"].trtllm_flag,
            max_draft_len=max(v.max_draft_len or 0 for v in dte_users),
            source=t.model,
            variant=None,
            # Logits-based acceptance compares the draft's and the target's
            # logits, so the verifying target gathers them too:
            # examples/draft_target_model/README.md (TensorRT-LLM @11925f62,
            # 0.18.0): "--gather_generation_logits is necessary if using
            # generation logits for selecting tokens in target model".
            gather_logits=any(
                isinstance(v, DraftModelVariant) and v.use_draft_logits for v in dte_users
            ),
        )
    if b.gpu:
        ckpt = b.target_checkpoint(target_src)
        b.gpu_engine(base, ckpt, target_src, q, dtype)
    else:
        b.reference_engine(base, target_src, q, dtype, {}, [])

    variants.update(_variant_engines(b, spec))
    if b.gpu:
        for name, e in b.engines.items():
            b.engines[name] = replace(e, devices=placement(e, spec))
    _add_engine_steps(b, spec, target_src)
    ordered = list(b.engines.values())
    return Plan(
        spec_name=spec.name,
        spec_hash=spec.spec_hash,
        backend=spec.backend.value,
        root=b.root,
        engines=ordered,
        steps=b.steps,
        variants=variants,
        unit_keys=dict(b.unit_keys),
    )


def _variant_engines(b: _Builder, spec: Spec) -> dict[str, VariantEngines]:
    """Name every variant's engines (the steps come later, in spec order):
    draft-loop variants share target_dte (+ one draft engine per distinct
    draft model), in-engine modes get their own target engine."""
    out: dict[str, VariantEngines] = {}
    taken: set[str] = {v.name for v in spec.variants}  # Triton model names are shared
    for v in spec.variants:
        mode = MODES[v.mode]
        if not mode.draft_loop:
            # medusa / eagle / lookahead: one target engine that drafts inside itself
            name = mode.engine_name(v.name)
            b.engine(
                name,
                role="target",
                mode=ENGINE_MODES[mode.engine_mode].trtllm_flag,
                max_draft_len=v.max_draft_len or 0,
                source=spec.target.model,
                variant=v.name,
                num_eagle_layers=v.num_eagle_layers if isinstance(v, EagleVariant) else 0,
            )
            out[v.name] = VariantEngines(name, None, v.mode)
            continue
        dte = b.engines[DRAFT_LOOP_ENGINE]
        b.engine(
            DRAFT_LOOP_ENGINE,
            role="target",
            mode=dte.mode,
            max_draft_len=dte.max_draft_len,
            source=spec.target.model,
            variant=v.name,
        )
        draft_name = None
        if isinstance(v, DraftModelVariant):
            draft_name = _draft_engine_name(b, spec, v, taken)
            b.engine(
                draft_name,
                role="draft",
                mode="none",
                max_draft_len=0,
                source=v.draft.model,
                variant=v.name,
                tp=v.draft.tp,
                pp=v.draft.pp,
                gather_logits=needs_draft_logits(v),
            )
        out[v.name] = VariantEngines(DRAFT_LOOP_ENGINE, draft_name, v.mode)
    return out


def placement(e: EnginePlan, spec: Spec) -> tuple[tuple[int, ...], ...]:
    """The GPUs of each Triton instance of engine ``e`` (tensorrtllm ``gpu_device_ids``).

    Each instance of a ``tensorrtllm`` model builds its own executor with its
    own weights and KV pool (tensorrtllm_backend v0.19.0
    ``inflight_batcher_llm/src/model_instance_state.cc``: instance i takes
    ``gpu_device_ids`` entry ``i % n``), and the backend does not place
    instances by ``instance_group`` (``docs/llama_multi_instance.md`` at
    v0.19.0: "0,1;2,3" for two TP=2 instances). So instance i of every target
    engine gets its own TP×PP GPUs, ``i·W … i·W+W−1``: one copy of each
    engine per GPU, which is what the memory plan counts. A draft engine
    shares its instance's first draft-TP×PP GPUs (examples/draft_target_model/
    README.md @11925f62: draft and target on the same GPU performs better
    when it fits; the memory plan adds the draft there)."""
    t = spec.target
    width = t.tp * t.pp
    return tuple(tuple(range(i * width, i * width + e.world)) for i in range(int(t.instances)))


def _draft_engine_name(b: _Builder, spec: Spec, v: DraftModelVariant, taken: set[str]) -> str:
    """One draft engine per distinct (model, quantization, dtype), named after the
    model; a hash suffix where the name would clash with a variant's."""
    d = v.draft
    ident = draft_identity(spec, v)
    if ident not in b.drafts:
        name = "draft_" + slug(d.model)
        if d.quantization is not Quantization.none:
            name += "_" + d.quantization.value
        if d.world != 1:
            name += f"_tp{d.tp}pp{d.pp}"
        if name in taken:
            name += "_" + hashlib.sha256(repr(ident).encode()).hexdigest()[:6]
        taken.add(name)
        b.drafts[ident] = name
    return b.drafts[ident]


def _add_engine_steps(b: _Builder, spec: Spec, target_src: str) -> None:
    """Steps for every engine except the baseline (already added): the shared
    target_dte here, each variant's own through its mode module's recipe."""
    t = spec.target
    q, dtype = t.quantization, spec.dtype
    if DRAFT_LOOP_ENGINE in b.engines:
        e = b.engines[DRAFT_LOOP_ENGINE]
        if b.gpu:
            b.gpu_engine(e, b.target_checkpoint(target_src), target_src, q, dtype)
        else:
            b.reference_engine(e, target_src, q, dtype, {}, [])
    for v in spec.variants:
        module = module_for(v)
        (module.gpu_steps if b.gpu else module.reference_steps)(b, spec, v, target_src)
