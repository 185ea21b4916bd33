"""Loading a reference engine folder's weights: the target model and its heads.

``hf/`` holds a Hugging Face causal-LM folder (float32 safetensors). A model
the fast path runs is read without transformers (``lean_model.py``: exactly
the Hugging Face-loaded model, bit for bit, or it declines); everything else,
and EAGLE engines, load through ``AutoModelForCausalLM`` (``load_target``).
On the demo engines this took a target stub's load from 5.5–6.5 CPU-s to
2.4–3.4 and the int8 draft's from 8.5–9.2 to 3.7–3.9, torch's own import
(~1.5) included (docs/design/engines.md). When the engine
config records ``quantization: int8`` every ``nn.Linear`` is replaced
at load by a dynamically int8-quantized one (``quantize_linear``: what
``quantize_dynamic`` makes, qint8, one weight scale per output channel, so
stacking q/k/v changes no scale; built on one thread without the placeholder
prepack): a cheap draft on CPU that agrees with the float model on most tokens. Medusa
heads (``medusa/``) and the EAGLE layer (``eagle/``) are loaded by
``heads.py``. Attention runs through SDPA so custom 4-D tree masks apply.

Float32 ``nn.Linear`` layers are swapped for ``PackedLinear``: the weight is
reordered once into oneDNN's blocked layout and every call goes straight to
oneDNN with at least ``PAD_ROWS`` rows (fewer are zero-padded). On two CPU
cores torch's default ``F.linear`` (MKL sgemm) costs ~60 % more for 2–4 rows
than for one, and that is the verification step of every speculative mode;
the packed path runs 1–4 rows in the same time, faster than ``F.linear`` does
one, which is what makes speculation pay on a CPU at all. Rows are computed
independently, so padding changes no value, and every step of up to
``PAD_ROWS`` tokens uses the same kernel. ``TRTSPEC_ENGINE_ONEDNN=0`` turns it
off (benchmarks/reference_engine.py measures both).
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trtspec.runtime.engine.config import EngineConfig, EngineError


def quantize_linear(linear: Any) -> Any:
    """One float ``nn.Linear`` as ``quantize_dynamic(model, {nn.Linear:
    per_channel_dynamic_qconfig}, dtype=torch.qint8)`` swaps it: the same
    observer, the same ``_quantize_weight`` and the same ``linear_prepack``
    (``torch.ao.nn.quantized.dynamic.Linear.from_float``), but the module is
    first built 1×1: ``from_float`` builds it at full size, which prepacks an
    uninitialised full-size weight only to replace it (a third of the int8
    draft's quantization time). The tests check the packed weights, scales
    and outputs against ``quantize_dynamic``'s bit for bit."""
    import torch

    with warnings.catch_warnings():
        # torch.ao.quantization warns that it moves to torchao; it still works
        # and is the only dependency-free dynamic int8 path in torch itself.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantize_per_channel.*")
        from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
        from torch.ao.quantization import per_channel_dynamic_qconfig

        try:
            from torch.ao.nn.quantized.modules.utils import _quantize_weight
        except ImportError:  # a torch without the helper: from_float itself
            linear.qconfig = per_channel_dynamic_qconfig
            return DynamicLinear.from_float(linear)
        observer = per_channel_dynamic_qconfig.weight()
        observer(linear.weight)
        qweight = _quantize_weight(linear.weight.float(), observer)
        qlinear = DynamicLinear(1, 1, dtype=torch.qint8)
        qlinear.in_features, qlinear.out_features = linear.in_features, linear.out_features
        qlinear.set_weight_bias(qweight, linear.bias)
    return qlinear


def quantize_int8(model: Any) -> Any:
    """Every ``nn.Linear`` of ``model`` swapped for its dynamic int8 version
    (``quantize_linear``), in place: what ``quantize_dynamic(model,
    {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8,
    inplace=True)`` does, without its placeholder prepacks."""
    from torch import nn

    linears = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear
    ]
    for parent, name, child in linears:
        setattr(parent, name, quantize_linear(child))
    return model


def onednn_enabled() -> bool:
    """Whether ``pack_linears`` will pack (oneDNN present and not switched off)."""
    if os.environ.get("TRTSPEC_ENGINE_ONEDNN", "1").strip() in ("0", "false", "no", "off"):
        return False
    import torch

    return bool(torch.backends.mkldnn.is_available()) and all(
        hasattr(torch.ops.mkldnn, op) for op in ("_linear_pointwise", "_reorder_linear_weight")
    )


PAD_ROWS = 4  # rows the packed layout is chosen for; fewer rows are padded up to it


@functools.cache
def _packed_linear_class() -> type:
    import torch
    from torch import nn

    _op = torch.ops.mkldnn._linear_pointwise.default

    class PackedLinear(nn.Module):
        """``nn.Linear`` computed by oneDNN from a weight reordered once at load.

        ``weight`` stays the original parameter when another module shares it
        (tied embeddings) and otherwise becomes a shape-only ``meta`` tensor,
        so packing does not double the model's memory."""

        def __init__(self, linear: nn.Linear, *, keep_dense: bool) -> None:
            super().__init__()
            self.in_features = linear.in_features
            self.out_features = linear.out_features
            weight = linear.weight.detach()
            self.register_buffer(
                "packed",
                torch.ops.mkldnn._reorder_linear_weight(weight, PAD_ROWS),
                persistent=False,
            )
            self.bias = linear.bias
            self.weight = (
                linear.weight
                if keep_dense
                else nn.Parameter(torch.empty_like(weight, device="meta"), requires_grad=False)
            )

        def forward(self, x: Any) -> Any:
            if x.dim() == 1:
                return self.forward(x[None])[0]
            rows = x.shape[-2]
            if rows >= PAD_ROWS:
                return _op(x, self.packed, self.bias, "none", [], "")
            pad = x.new_zeros(*x.shape[:-2], PAD_ROWS - rows, x.shape[-1])
            out = _op(torch.cat([x, pad], dim=-2), self.packed, self.bias, "none", [], "")
            return out[..., :rows, :]

        def extra_repr(self) -> str:
            return f"in_features={self.in_features}, out_features={self.out_features}, onednn"

    return PackedLinear


def pack_linear(linear: Any) -> Any:
    """One float32 ``nn.Linear`` owned by nobody else, packed (or returned as is)."""
    import torch

    if not onednn_enabled() or linear.weight.dtype != torch.float32:
        return linear
    return _packed_linear_class()(linear, keep_dense=False)


def pack_linears(model: Any) -> int:
    """Swap every float32 ``nn.Linear`` in ``model`` for a ``PackedLinear``;
    returns how many were swapped (0 when oneDNN is off or unavailable)."""
    import torch
    from torch import nn

    if not onednn_enabled():
        return 0
    packed_cls = _packed_linear_class()
    linears = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear and child.weight.dtype == torch.float32
    ]
    swapped = {id(child) for _, _, child in linears}
    # weights some other (non-swapped) module also holds, e.g. a tied embedding
    shared = {
        id(p)
        for module in model.modules()
        if id(module) not in swapped
        for p in module.parameters(recurse=False)
    }
    for parent, name, child in linears:
        setattr(parent, name, packed_cls(child, keep_dense=id(child.weight) in shared))
    return len(linears)


def uses_lean_loader(config: EngineConfig) -> bool:
    """Whether ``load_target`` tries ``lean_model.load_lean`` first: not for
    EAGLE engines (the EAGLE layer is a transformers ``LlamaModel`` and its
    cache a ``DynamicCache``), nor with the fast path or the lean loader
    switched off (``TRTSPEC_ENGINE_FASTPATH=0`` / ``TRTSPEC_ENGINE_LEAN=0``)."""
    from trtspec.runtime.engine import fastpath, lean_model

    return config.mode != "eagle" and fastpath.enabled() and lean_model.enabled()


def load_target(config: EngineConfig) -> Any:
    """The engine's target model, fused, packed or int8-quantized, its input
    embedding mapped from the file and its other dense tensors owned.

    A Llama-shaped model the fast path runs is read without transformers
    (``lean_model``: ~3 CPU-s of imports and the ``from_pretrained``
    machinery saved per stub); anything ``lean_model`` does not reproduce
    exactly, and EAGLE engines, load through ``AutoModelForCausalLM``. The
    model records which in ``_trtspec_loader`` ("lean" or "hf") and, for "hf"
    after a lean attempt, why in ``_trtspec_lean_declined``."""
    hf = config.hf_dir
    if not (hf / "config.json").is_file():
        raise EngineError(
            f"{hf}: no Hugging Face model folder (hf/config.json) in the engine",
            hint="rebuild the engine with `trtspec build` (backend: reference)",
        )
    int8 = config.quantization == "int8"
    from trtspec.runtime.engine import shared_weights

    share = not int8 and onednn_enabled() and shared_weights.enabled()
    # An int8 model is loaded and quantized on one thread: fbgemm's packed
    # layout and every quantized value are the same on any thread count (the
    # tests check), and a second thread only spins beside the serial prepack
    # (demo draft: 4.1 CPU-s on two threads, 2.1 on one, same wall time).
    # Float32 weights are packed on the decode thread count (see decode.py).
    with (
        _threads(1) if int8 else contextlib.nullcontext(),
        # one float32 engine of this folder packs at a time (see one_packer)
        one_packer(hf.parent.parent / shared_weights.FOLDER)
        if not int8 and onednn_enabled()
        else contextlib.nullcontext(),
        shared_weights.page_aligned_packing() if share else contextlib.nullcontext(),
    ):
        model, declined = None, ""
        if uses_lean_loader(config):
            from trtspec.runtime.engine.lean_model import load_lean

            # each layer's projections packed or quantized as they are built
            finish = quantize_linear if int8 else pack_linear if onednn_enabled() else None
            model, declined = load_lean(hf, finish)
        if model is None:
            model = _load_hf(hf)
            model._trtspec_loader = "hf"
            model._trtspec_lean_declined = declined
        else:
            model._trtspec_loader = "lean"
        if int8:
            model = quantize_int8(model)  # (lean: only the LM head is left)
        else:
            pack_linears(model)
        mapped = map_input_embeddings(model, hf / "model.safetensors")
        own_weights(model, keep=mapped)
    # engines serving the same weights (target, target_dte, lookahead, a
    # benchmark's parity copy) share one packed copy (shared_weights.py)
    model._trtspec_shared = (
        shared_weights.share_packed(model, hf.parent.parent / shared_weights.FOLDER)
        if share
        else shared_weights.Shared(None, 0, why_not="off")
    )
    return model


PACKING_LOCK = "packing.lock"
# then it packs anyway: a stuck peer (or another server loading from the same
# engines) never holds a load for long; well inside a server's start timeout
PACKING_WAIT_S = 30.0


@contextlib.contextmanager
def one_packer(folder: Path, wait_s: float | None = None) -> Iterator[bool]:
    """Hold ``folder/packing.lock`` (``flock``) for the block, so that the
    engine stubs of one server starting together build and pack their float32
    weights one after another; yields whether it holds the lock.

    Why: packing runs on the decode thread count (oneDNN's parallel
    regions), and several stubs doing it at once on few cores leave each
    one's threads spinning at every region's barrier for a peer the kernel
    descheduled. Measured on two cores, four demo targets loading at once:
    3.1-3.4 CPU-s and ~4 s of packing each; one at a time: 2.3-2.6 CPU-s and
    0.7-0.9 s each, all four done a second sooner. A single thread has no
    barrier to spin at: it takes no lock. The lock goes with the process (a
    crashed stub frees it); past ``wait_s`` or where the folder cannot be
    written, the load packs without it (``wait_s``: ``PACKING_WAIT_S``)."""
    import fcntl
    import time

    import torch

    fd = -1
    if torch.get_num_threads() > 1:
        with contextlib.suppress(OSError):
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(folder / PACKING_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    held = False
    try:
        deadline = time.monotonic() + (PACKING_WAIT_S if wait_s is None else wait_s)
        while fd >= 0 and not held:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.02)
            except OSError:
                break
        yield held
    finally:
        if fd >= 0:
            os.close(fd)  # releases the lock


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    """torch's intra-op thread count set to ``n`` for the block, then restored."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _load_hf(hf: Path) -> Any:
    """``AutoModelForCausalLM.from_pretrained`` (float32, SDPA), fused where
    the fast path supports it."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(hf), dtype=torch.float32, attn_implementation="sdpa"
        )
    except (OSError, ValueError) as exc:
        raise EngineError(f"{hf}: cannot load the model: {exc}") from None
    model.eval()
    from trtspec.runtime.engine.fastpath import fuse

    fuse(model)
    return model


def map_input_embeddings(model: Any, file: Path) -> Any:
    """Point the input embedding at its rows in ``file`` through a
    copy-on-write mapping of just that tensor; returns the mapped tensor, or
    ``None`` (the embedding stays as loaded) when the file does not hold it
    in float32 in the model's shape.

    The embedding is read a few rows per step (one per token fed), so only
    the rows of tokens actually seen become resident, and those pages are
    the page cache's, shared by every stub that maps the same file; a private
    copy would hold the whole table (113 MB for SmolLM2-135M) per engine.
    A tied LM head keeps using it only when it is not packed (packed, it
    reads its own reordered copy)."""
    import json
    import struct

    import numpy as np
    import torch

    embedding = model.get_input_embeddings()
    weight = getattr(embedding, "weight", None)
    if weight is None or weight.dtype != torch.float32 or weight.device.type != "cpu":
        return None
    try:
        with open(file, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
    except (OSError, ValueError, struct.error):
        return None
    entry = next(
        (v for k, v in header.items() if k.endswith("embed_tokens.weight") and isinstance(v, dict)),
        None,
    )
    if (
        entry is None
        or entry.get("dtype") != "F32"
        or list(entry.get("shape", [])) != list(weight.shape)
    ):
        return None
    begin, end = entry["data_offsets"]
    if end - begin != weight.numel() * 4:
        return None
    rows = np.memmap(
        file, dtype=np.float32, mode="c", offset=8 + size + begin, shape=tuple(weight.shape)
    )
    mapped = torch.from_numpy(rows)
    if not torch.equal(mapped[:8], weight.detach()[:8]):
        return None  # not the tensor the model loaded (a conversion on load)
    with torch.no_grad():
        weight.data = mapped
    return mapped


def own_weights(model: Any, keep: Any = None) -> int:
    """Copy the dense tensors the model still reads from the safetensors file
    (norms, biases; not ``keep``) into memory of its own, so the file's mapping
    is released, then hand freed heap back to the system; returns the bytes copied.

    ``from_pretrained`` memory-maps ``model.safetensors`` and its float32
    tensors are views of that mapping. Once the linears are packed or
    quantized only a fifth of the file is still read, but the whole mapping
    stays resident for the life of the stub (RSS and PSS: each engine folder
    holds its own copy of the file, so no other process shares its pages).
    The load also leaves the stacked and reordered copies' freed memory in
    glibc's heap; ``malloc_trim`` returns it."""
    import torch

    copied = 0
    with torch.no_grad():
        tensors = [*model.parameters(), *model.buffers()]
        for tensor in tensors:
            if tensor.device.type != "cpu" or tensor.layout != torch.strided:
                continue
            if keep is not None and tensor.data_ptr() == keep.data_ptr():
                continue  # mapped on purpose (map_input_embeddings)
            tensor.data = tensor.data.clone()
            copied += tensor.numel() * tensor.element_size()
    import gc

    gc.collect()  # the float model quantize_int8 replaced can sit in reference cycles
    release_free_memory()
    return copied


def release_free_memory() -> bool:
    """``malloc_trim(0)``: give the heap's free pages back (glibc only)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    return bool(trim(0))


def load_heads(config: EngineConfig, model: Any) -> tuple[Any, Any]:
    """(medusa heads or None, EAGLE drafter or None) for the engine's mode."""
    from trtspec.runtime.engine.heads import EagleDrafter, build_medusa

    medusa = eagle = None
    if config.mode == "medusa":
        folder = config.path / "medusa"
        if not folder.is_dir():
            raise EngineError(f"{folder}: medusa engine without its medusa/ heads folder")
        medusa = build_medusa(
            folder,
            int(model.config.hidden_size),
            int(model.get_output_embeddings().weight.shape[0]),
        )
    if config.mode == "eagle":
        folder = config.path / "eagle"
        if not folder.is_dir():
            raise EngineError(f"{folder}: eagle engine without its eagle/ folder")
        eagle = EagleDrafter(folder, model)
        pack_linears(eagle.layer_model)
        eagle.fc = pack_linear(eagle.fc)
    if medusa is not None:
        pack_linears(medusa)
    return medusa, eagle
