"""The GPU memory plan of a spec: how much GPU memory each engine needs, and
whether the engines one ``tritonserver`` loads fit on the GPU.

Estimates come from each model's Hugging Face ``config.json`` (layers,
hidden, intermediate, vocabulary, attention and KV heads, head size, tied
embeddings, experts): weights are the parameter count times the bytes per
parameter of the engine's dtype or weight quantization (embeddings, the LM
head and norms stay in the dtype, as TensorRT-LLM's quantizers leave them),
KV cache bytes per token are ``2 × layers × kv_heads × head_dim × bytes``, and
a rough activation budget covers ``max_num_tokens`` in flight. Every engine
model holds its own weights and KV cache, so a repository of five 7B target
engines holds five copies. The plan sums them per server — the whole
repository (``trtspec serve``) or one variant's engines (``bench --isolate``)
— against a GPU size, warns when they cannot fit and names the split that
would, and derives ``kv_cache_free_gpu_mem_fraction`` per engine.

That fraction is of the memory *free when the engine loads*, and Triton may
load the engines in any order; so each engine gets
``share / (gpu − own weights − own overhead)``, its share of the KV pool over
the most memory it can ever find free. Loaded first, it takes exactly its
share; loaded later, less, so the engines never take more than the pool
together. No Click here; the CLI and ``repo.assemble`` call it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtspec.catalogue import BASELINE
from trtspec.errors import TrtspecError

GIB = 1 << 30
MIB = 1 << 20
DTYPE_BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0}
# Bytes per parameter of the quantized linear layers. Group-wise int4 (AWQ,
# group 128) stores one fp16 scale per group. The reference backend's int8 is
# dynamic int8 on CPU: one byte per weight.
QUANT_BYTES = {
    "fp8": 1.0,
    "int8_sq": 1.0,
    "int8_wo": 1.0,
    "int8": 1.0,
    "int4_wo": 0.5,
    "int4_awq": 0.5 + 2.0 / 128,
}
# The generation-logits cache of an engine built with --gather_generation_logits
# (draft-model engines and the target_dte that verifies by logits): two
# float32 buffers of [max_batch_size × beam, GENERATION_LOGITS_BUFFER_LENGTH,
# vocab] (NVIDIA/TensorRT-LLM cpp/tensorrt_llm/batch_manager/runtimeBuffers.cpp:
# cacheTransposedGenerationLogits and cacheGenerationLogits;
# cpp/include/tensorrt_llm/batch_manager/runtimeBuffers.h @95ca1eae:
# GENERATION_LOGITS_BUFFER_LENGTH = 8). The engines' logits are float32
# (runtime/contract.py LOGITS_DATATYPE).
GENERATION_LOGITS_BUFFER_LENGTH = 8
LOGITS_BYTES = 4
# Per engine model: TensorRT-LLM's runtime buffers and workspace outside the
# activations (a rough, fixed allowance); per tritonserver process: the CUDA
# context. Both are estimates, stated as such in the output.
ENGINE_RESERVE_BYTES = 512 * MIB
PROCESS_RESERVE_BYTES = 1 * GIB
MIN_FRACTION = 0.0001  # the smallest fraction written (4 decimals, never 0)


class MemoryPlanError(TrtspecError):
    """A size or a model config the memory plan cannot use."""


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(TiB|TB|GiB|GB|MiB|MB|KiB|KB|B)\s*$", re.IGNORECASE)
_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}


def parse_size(text: str) -> int:
    """``"80GiB"`` → bytes. Decimal (GB) and binary (GiB) units; a unit is required."""
    m = _SIZE.match(str(text))
    if not m:
        raise MemoryPlanError(
            f"GPU memory {text!r} is not a size",
            "write a number and a unit, e.g. 80GiB, 141GB or 24576MiB",
        )
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


# --------------------------------------------------------------------- models
@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder-only transformer that decide its size."""

    layers: int
    hidden: int
    intermediate: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool = False
    experts: int = 1
    qkv_bias: bool = False

    @classmethod
    def from_config(cls, cfg: dict[str, Any], where: str = "config.json") -> ModelShape:
        try:
            hidden = int(cfg["hidden_size"])
            heads = int(cfg["num_attention_heads"])
            shape = cls(
                layers=int(cfg["num_hidden_layers"]),
                hidden=hidden,
                intermediate=int(cfg["intermediate_size"]),
                vocab=int(cfg["vocab_size"]),
                heads=heads,
                kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                tied=bool(cfg.get("tie_word_embeddings", False)),
                experts=int(cfg.get("num_local_experts") or 1),
                qkv_bias=str(cfg.get("model_type", "")).startswith("qwen2"),
            )
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
            raise MemoryPlanError(
                f"{where}: not a decoder config the memory plan can read ({exc!r} missing or bad)",
                "point the spec at a Hugging Face model folder with a complete config.json",
            ) from None
        return shape

    def layer_linear_params(self) -> int:
        """Parameters of one layer's linear weights (what a quantizer shrinks)."""
        q_out, kv_out = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = self.hidden * (q_out + 2 * kv_out) + q_out * self.hidden
        mlp = 3 * self.hidden * self.intermediate * self.experts  # gate, up, down
        return attention + mlp

    def other_params(self) -> int:
        """Embeddings, LM head, norms, biases and routers: kept in the dtype."""
        q_out, kv_out = self.heads * self.head_dim, self.kv_heads * self.head_dim
        per_layer = 2 * self.hidden
        if self.qkv_bias:
            per_layer += q_out + 2 * kv_out
        if self.experts > 1:
            per_layer += self.hidden * self.experts
        embed = self.vocab * self.hidden
        return embed * (1 if self.tied else 2) + self.layers * per_layer + self.hidden

    def parameters(self) -> int:
        return self.layers * self.layer_linear_params() + self.other_params()

    def weight_bytes(self, dtype: str, quantization: str = "none") -> int:
        dbytes = DTYPE_BYTES[dtype]
        qbytes = QUANT_BYTES.get(quantization, dbytes)
        return int(self.layers * self.layer_linear_params() * qbytes + self.other_params() * dbytes)

    def kv_bytes_per_token(
        self, dtype: str, tp: int = 1, pp: int = 1, extra_layers: int = 0
    ) -> int:
        """K and V bytes of one token on one rank: ``2 × layers × kv_heads ×
        head_dim × bytes`` with the layers split over ``pp`` and the KV heads
        over ``tp``, each rank holding ``ceil(kv_heads / tp)`` of them (KV heads
        are replicated when TP exceeds them: NVIDIA/TensorRT-LLM
        ``tensorrt_llm/runtime/model_runner.py`` @2340c776,
        ``num_kv_heads = (num_kv_heads + tp_size - 1) // tp_size``).
        ``extra_layers``: attention layers beyond the model's own in the same
        KV pool (EAGLE's draft layer)."""
        layers = -(-(self.layers + extra_layers) // pp)
        kv_heads = -(-self.kv_heads // tp)
        return int(2 * layers * kv_heads * self.head_dim * DTYPE_BYTES[dtype])


def read_config(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise MemoryPlanError(
            f"{path}: cannot read ({exc})", "check the model folder named in the spec"
        ) from None
    if not isinstance(data, dict):
        raise MemoryPlanError(f"{path}: not a JSON object", "check the model folder")
    return data


def find_config(spec: Any, ref: str, root: Path | None) -> Path | None:
    """The ``config.json`` of a spec model reference, if it is on this machine:
    the local folder, the plan's download folder, or the Hugging Face cache."""
    from trtspec.plan import slug

    loc = spec.model_location(ref)
    candidates: list[Path] = []
    if loc.kind == "local":
        candidates.append(Path(loc.ref) / "config.json")
    elif loc.kind == "hub":
        if root is not None:
            candidates.append(Path(root) / ".sources" / slug(loc.ref) / "config.json")
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(loc.ref, "config.json")
            if isinstance(cached, str):
                candidates.append(Path(cached))
        except ImportError:  # pragma: no cover - transformers depends on it
            pass
    return next((c for c in candidates if c.is_file()), None)


# -------------------------------------------------------------------- engines
@dataclass
class EngineMemory:
    """One engine model's estimate, per GPU of its TP×PP group."""

    name: str
    role: str
    model: str
    dtype: str
    quantization: str
    gpus: int
    config: str | None = None  # the config.json it came from; None = unknown
    weights: int = 0
    activations: int = 0
    kv_per_token: int = 0
    kv_full: int = 0  # max_batch_size sequences of max_seq_len tokens
    kv_min: int = 0  # one sequence of max_seq_len tokens
    logits_cache: int = 0  # gather engines only (GENERATION_LOGITS_BUFFER_LENGTH)
    max_seq_len: int = 0  # the engine's, as trtllm-build raised it
    max_num_tokens: int = 0
    instances: int = 1
    devices: str = ""  # gpu_device_ids: each instance on GPUs of its own
    note: str = ""

    @property
    def known(self) -> bool:
        return self.config is not None

    @property
    def fixed(self) -> int:
        """Memory one instance takes on each of its GPUs before its KV cache:
        weights + overhead. Instances sit on GPUs of their own (plan.placement),
        so a GPU holds one instance of each engine."""
        return self.weights + self.activations + self.logits_cache + ENGINE_RESERVE_BYTES

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.name,
            "role": self.role,
            "model": self.model,
            "dtype": self.dtype,
            "quantization": self.quantization,
            "gpus": self.gpus,
            "config": self.config,
            "weights_bytes": self.weights,
            "activation_bytes": self.activations,
            "kv_bytes_per_token": self.kv_per_token,
            "kv_full_bytes": self.kv_full,
            "kv_min_bytes": self.kv_min,
            "logits_cache_bytes": self.logits_cache,
            "max_seq_len": self.max_seq_len,
            "max_num_tokens": self.max_num_tokens,
            "instances": self.instances,
            "gpu_device_ids": self.devices,
            "note": self.note,
        }


def _heads_params(spec: Any, variant: Any, shape: ModelShape) -> tuple[int, str]:
    """Extra parameters of Medusa heads / an EAGLE layer (their checkpoints are
    not read: Medusa heads are ResBlocks + an LM head each, EAGLE-1 one
    decoder layer + an fc of 2·hidden → hidden sharing the target's head)."""
    mode = getattr(variant, "mode", None)
    h = shape.hidden
    if mode == "medusa":
        heads = int(variant.num_medusa_heads)
        return heads * (h * h + h + shape.vocab * h), f"+{heads} Medusa heads"
    if mode == "eagle":
        # num_eagle_layers is the draft tree's depth, not a count of networks
        return shape.layer_linear_params() + 2 * h + 2 * h * h, "+EAGLE layer"
    return 0, ""


def _eagle_layers(spec: Any, variant: Any, root: Path | None) -> int:
    """Attention layers of the EAGLE draft network (``eagle_net_config``): its
    checkpoint's ``num_hidden_layers`` when the config is here, else EAGLE-1's 1."""
    path = find_config(spec, variant.checkpoint, root)
    if path is not None:
        try:
            return max(1, int(read_config(path).get("num_hidden_layers") or 1))
        except (MemoryPlanError, TypeError, ValueError):
            pass
    return 1


def engine_memory(spec: Any, plan: Any) -> list[EngineMemory]:
    """Estimate every engine of ``plan`` from the values it is built with
    (``EnginePlan.max_seq_len`` / ``max_num_tokens`` after trtllm-build's
    increases, its own TP×PP); models whose config.json is not on this machine
    are listed as unknown, with where it would be."""
    from trtspec.modes.draft_model import draft_dtype

    t = spec.target
    out: list[EngineMemory] = []
    for e in plan.engines:
        variants = [spec.variant(v) for v in e.variants if v != BASELINE]
        if e.role == "draft":
            v = variants[0]
            dtype, quant = draft_dtype(spec, v), v.draft.quantization.value
            max_draft = 0
        else:
            dtype, quant = spec.dtype, t.quantization.value
            max_draft = int(e.max_draft_len or 0)
        gpus = int(e.tp) * int(e.pp)
        mem = EngineMemory(
            name=e.name, role=e.role, model=e.source, dtype=dtype, quantization=quant, gpus=gpus
        )
        mem.max_seq_len = int(e.max_seq_len or t.max_seq_len)
        mem.max_num_tokens = int(e.max_num_tokens or t.max_num_tokens)
        mem.instances = int(t.instances) if spec.backend.gpu else 1
        mem.devices = e.gpu_device_ids
        path = find_config(spec, e.source, plan.root)
        if path is None:
            mem.note = "config.json not on this machine (build downloads it)"
            out.append(mem)
            continue
        try:
            shape = ModelShape.from_config(read_config(path), str(path))
        except MemoryPlanError as exc:
            mem.note = exc.message
            out.append(mem)
            continue
        mem.config = str(path)
        extra, mem.note, eagle_layers = 0, "", 0
        if e.role == "target" and variants and e.mode in ("medusa", "eagle"):
            extra, mem.note = _heads_params(spec, variants[0], shape)
            if e.mode == "eagle":
                # EAGLE's draft layer keeps its KV in the engine's pool
                # (tensorrt_llm/models/eagle/model.py @89fd9b74: prepare_inputs
                # passes num_hidden_layers + eagle_net_config.num_hidden_layers).
                eagle_layers = _eagle_layers(spec, variants[0], plan.root)
        weights = shape.weight_bytes(dtype, quant) + int(extra * DTYPE_BYTES[dtype])
        dbytes = DTYPE_BYTES[dtype]
        # Live activations of one layer for max_num_tokens tokens (TensorRT
        # reuses them across layers) plus the logits of every generation slot.
        act = mem.max_num_tokens * (2 * shape.intermediate + 4 * shape.hidden) * dbytes
        act += int(t.max_batch_size) * (max_draft + 1) * shape.vocab * LOGITS_BYTES
        mem.weights = weights // gpus
        mem.activations = int(act) // gpus
        if e.gather_logits:
            mem.logits_cache = (
                2
                * int(t.max_batch_size)
                * int(t.max_beam_width)
                * GENERATION_LOGITS_BUFFER_LENGTH
                * shape.vocab
                * LOGITS_BYTES
            )
        mem.kv_per_token = shape.kv_bytes_per_token(dtype, int(e.tp), int(e.pp), eagle_layers)
        block = int(t.kv_cache.tokens_per_block)
        seq_blocks = -(-mem.max_seq_len // block)
        mem.kv_min = seq_blocks * block * mem.kv_per_token
        mem.kv_full = int(t.max_batch_size) * mem.kv_min
        out.append(mem)
    return out


# ----------------------------------------------------------------------- plan
@dataclass
class Fit:
    """The engines one tritonserver loads, against one GPU."""

    name: str  # "repository" or a variant name
    engines: list[str]
    fixed: int  # weights + overhead, the CUDA context included
    kv_min: int
    kv_full: int
    gpu: int | None
    known: bool = True

    @property
    def need_min(self) -> int:
        return self.fixed + self.kv_min

    @property
    def need_full(self) -> int:
        return self.fixed + self.kv_full

    @property
    def verdict(self) -> str:
        if not self.known:
            return "unknown"
        if self.gpu is None:
            return "-"
        if self.need_full <= self.gpu:
            return "fits"
        if self.need_min <= self.gpu:
            return "fits, smaller KV cache"
        return "does not fit"


@dataclass
class MemoryPlan:
    engines: list[EngineMemory]
    fits: list[Fit]  # the repository first, then each variant alone
    gpu: int | None
    kv_fraction: float  # the spec's kv_cache.free_gpu_mem_fraction
    fractions: dict[str, float] = field(default_factory=dict)
    gpus: int = 0  # GPUs the engines are placed on (Plan.gpus); each holds what a server needs
    # LLM-API flow: each variant's kv_cache_config.max_tokens (trtspec.flows.llmapi_memory)
    kv_tokens: dict[str, int] = field(default_factory=dict)

    @property
    def known(self) -> bool:
        return all(e.known for e in self.engines)

    def engine(self, name: str) -> EngineMemory:
        return next(e for e in self.engines if e.name == name)

    def warnings(self) -> list[str]:
        """What the user must act on before a long build (empty when it fits)."""
        if self.gpu is None or not self.known:
            return []
        repo, alone = self.fits[0], self.fits[1:]
        if repo.verdict == "fits":
            return []
        size = gib(self.gpu)
        if repo.verdict == "fits, smaller KV cache":
            return [
                f"the repository's {len(repo.engines)} engines fit in {size} only with "
                f"{gib(self.gpu - repo.fixed)} of KV cache, less than the "
                f"{gib(repo.kv_full)} that max_batch_size × max_seq_len needs; expect "
                "fewer requests in flight, or serve variants apart with `trtspec bench --isolate`"
            ]
        ok = [f.name for f in alone if f.verdict != "does not fit"]
        bad = [f for f in alone if f.verdict == "does not fit"]
        msg = (
            f"the repository's {len(repo.engines)} engines need at least "
            f"{gib(repo.need_min)} but the GPU has {size}"
        )
        if ok:
            msg += (
                f"; each of {', '.join(ok)} fits alone: benchmark with "
                "`trtspec bench --isolate` (one server per variant)"
            )
        for f in bad:
            if f.name == BASELINE:
                msg += (
                    f"; the baseline alone needs {gib(f.need_min)}: quantize the target "
                    "or raise target.tp"
                )
            else:
                msg += (
                    f"; variant {f.name} alone needs {gib(f.need_min)}: drop it, quantize, "
                    "or raise target.tp"
                )
        return [msg]

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu_memory_bytes": self.gpu,
            "gpus": self.gpus,
            "known": self.known,
            "engines": [
                {
                    **e.to_dict(),
                    "kv_cache_free_gpu_mem_fraction": self.fractions.get(e.name),
                    **(
                        {"kv_cache_max_tokens": self.kv_tokens.get(e.name)}
                        if self.kv_tokens
                        else {}
                    ),
                }
                for e in self.engines
            ],
            "servers": [
                {
                    "name": f.name,
                    "engines": f.engines,
                    "fixed_bytes": f.fixed if f.known else None,
                    "need_min_bytes": f.need_min if f.known else None,
                    "need_full_bytes": f.need_full if f.known else None,
                    "verdict": f.verdict,
                }
                for f in self.fits
            ],
            "warnings": self.warnings(),
        }

    def engine_rows(self) -> list[list[Any]]:
        rows = []
        for e in self.engines:
            frac = self.fractions.get(e.name)
            if not e.known:
                rows.append([e.name, "?", "?", "?", "-" if frac is None else f"{frac:.4f}", e.note])
                continue
            tokens = self.kv_tokens.get(e.name)
            note = e.note if tokens is None else f"{e.note} max_tokens {tokens}".strip()
            rows.append(
                [
                    e.name,
                    gib(e.weights),
                    f"{e.kv_per_token / 1024:.0f} KiB",
                    gib(e.kv_full),
                    "-" if frac is None else f"{frac:.4f}",
                    note,
                ]
            )
        return rows

    def server_rows(self) -> list[list[Any]]:
        return [
            [
                f.name,
                len(f.engines),
                gib(f.need_min) if f.known else "?",
                gib(f.need_full) if f.known else "?",
                f.verdict,
            ]
            for f in self.fits
        ]


def memory_plan(spec: Any, plan: Any, gpu_bytes: int | None = None) -> MemoryPlan:
    """The memory plan of ``plan``'s engines against ``gpu_bytes`` per GPU
    (an LLM-API spec's LLMs: ``trtspec.flows.llmapi_memory.llmapi_memory_plan``)."""
    engines = engine_memory(spec, plan)
    by_name = {e.name: e for e in engines}

    def fit(name: str, names: list[str]) -> Fit:
        members = [by_name[n] for n in names]
        return Fit(
            name=name,
            engines=names,
            fixed=PROCESS_RESERVE_BYTES + sum(m.fixed for m in members),
            kv_min=sum(m.kv_min for m in members),
            kv_full=sum(m.kv_full for m in members),
            gpu=gpu_bytes,
            known=all(m.known for m in members),
        )

    fits = [fit("repository", [e.name for e in engines])]
    for name, ve in plan.variants.items():
        fits.append(fit(name, [n for n in (ve.target, ve.draft) if n]))
    mp = MemoryPlan(
        engines=engines,
        fits=fits,
        gpu=gpu_bytes,
        kv_fraction=float(spec.target.kv_cache.free_gpu_mem_fraction),
        gpus=plan.gpus,
    )
    mp.fractions = kv_fractions(mp)
    return mp


def kv_fractions(mp: MemoryPlan) -> dict[str, float]:
    """``kv_cache_free_gpu_mem_fraction`` per engine.

    With a GPU size: the KV pool of a server (the spec's fraction of what is
    left after its engines' weights and overhead) is shared in proportion to
    each engine's full KV need, and each share is divided by the most memory
    that engine can find free (module docstring). The server is the whole
    repository when it fits, else each variant alone (``bench --isolate``),
    taking for each engine the smallest fraction of the servers it is in.
    Without a GPU size: the spec's fraction split in proportion to the KV
    needs. Unknown models: an equal split, as before there was a plan."""
    engines = mp.engines
    n = max(1, len(engines))
    if not mp.known or not engines:
        return {e.name: round(mp.kv_fraction / n, 4) for e in engines}
    if mp.gpu is None:
        total_want = sum(e.kv_full for e in engines) or 1
        return {
            e.name: _fraction(mp.kv_fraction * e.kv_full / total_want, mp.kv_fraction)
            for e in engines
        }
    gpu = mp.gpu
    servers = mp.fits[:1] if mp.fits[0].verdict != "does not fit" else mp.fits[1:]
    by_name = {e.name: e for e in engines}
    out: dict[str, float] = {}
    for server in servers:
        members = [by_name[name] for name in server.engines]
        total_want = sum(m.kv_full for m in members) or 1
        pool = max(0.0, (gpu - server.fixed) * mp.kv_fraction)
        for e in members:
            free_at_load = gpu - PROCESS_RESERVE_BYTES - e.fixed
            frac = pool * e.kv_full / total_want / free_at_load if free_at_load > 0 else 0.0
            frac = _fraction(frac, mp.kv_fraction)
            out[e.name] = min(out.get(e.name, frac), frac)
    return out


def _fraction(value: float, cap: float) -> float:
    """Four decimals, rounded down (never over the share), within [MIN_FRACTION, cap]."""
    return max(MIN_FRACTION, min(cap, int(value * 10_000) / 10_000))
