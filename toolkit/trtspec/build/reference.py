"""The reference backend's "engine builder": ``python -m trtspec.build.reference …``.

Run by the build executor as a subprocess with the argv of docs/design/engines.md,
it turns a source model (a Hugging Face folder, or a ``.gguf`` file that
transformers dequantizes) into an engine folder shaped like a TensorRT-LLM
one: ``hf/`` (HF config + float32 ``model.safetensors``), ``tokenizer/``
(tokenizer files and chat template), ``medusa/`` or ``eagle/`` (heads checked
against the target, then stored as safetensors in their public formats) and a
TRT-LLM-shaped ``config.json`` (integer ``speculative_decoding_mode``,
``max_draft_len``, plus the ``"trtspec"`` object). It writes into ``--output``
(the executor stages and renames that folder), with ``config.json`` last so a
folder without it is never mistaken for an engine. Bad arguments or sources
print ``Error: …`` (and ``Hint: …``) on stderr and exit 1.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from trtspec.catalogue import lookahead_max_draft_len
from trtspec.errors import TrtspecError, os_error
from trtspec.fsutil import atomic_write_json
from trtspec.runtime.engine.config import (
    REFERENCE_MODES,
    EngineError,
    build_config_document,
    check_lookahead,
    parse_choices,
)


class BuildError(TrtspecError):
    """The reference build cannot proceed (bad source, flags or checkpoint)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m trtspec.build.reference",
        description="Build a reference (CPU) engine folder.",
    )
    p.add_argument("--model", required=True, help="HF folder or .gguf file")
    p.add_argument("--output", required=True)
    p.add_argument("--mode", required=True, choices=REFERENCE_MODES)
    p.add_argument("--max-draft-len", type=int, default=0)
    p.add_argument("--max-batch-size", type=int, default=8)
    p.add_argument("--max-input-len", type=int, default=1024)
    p.add_argument("--max-seq-len", type=int, default=2048)
    p.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    p.add_argument("--quantization", default="none", choices=("none", "int8"))
    p.add_argument("--medusa-dir")
    p.add_argument("--num-medusa-heads", type=int)
    p.add_argument("--medusa-choices")
    p.add_argument("--eagle-dir")
    p.add_argument("--num-eagle-layers", type=int)
    p.add_argument("--eagle-choices")
    p.add_argument("--lookahead", help="W,N,G")
    return p.parse_args(argv)


def load_source(src: str) -> tuple[Any, Any]:
    """(model, tokenizer) from a HF folder or a .gguf file, float32, on CPU."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    # Progress bars would bury the executor's build.log and our Error: lines.
    hf_logging.disable_progress_bar()
    path = Path(src)
    if not path.exists():
        raise BuildError(
            f"--model {src}: no such file or folder",
            hint="give a local Hugging Face model folder or a .gguf file",
        )
    kwargs: dict[str, Any] = {}
    where = path
    if path.is_file():
        if path.suffix != ".gguf":
            raise BuildError(
                f"--model {src}: a file source must be a .gguf file",
                hint="or give a Hugging Face model folder",
            )
        where, kwargs = path.parent, {"gguf_file": path.name}
    elif not (path / "config.json").is_file():
        raise BuildError(
            f"--model {src}: folder has no config.json",
            hint="give a Hugging Face model folder (config.json + weights)",
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(where), **kwargs)
        model = AutoModelForCausalLM.from_pretrained(str(where), dtype=torch.float32, **kwargs)
    except (OSError, ValueError, KeyError) as exc:
        raise BuildError(f"--model {src}: cannot load: {exc}") from None
    # A GGUF load leaves a dequantization marker that save_pretrained would persist.
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model.eval(), tokenizer


def _write_medusa(args: argparse.Namespace, model: Any, out: Path) -> tuple[int, list[list[int]]]:
    from safetensors.torch import save_file

    from trtspec.runtime.engine.heads import _load_state_dict, build_medusa, medusa_shape

    if not args.medusa_dir:
        raise BuildError("--mode medusa needs --medusa-dir (a medusa_lm_head checkpoint folder)")
    src = Path(args.medusa_dir)
    if not src.is_dir():
        raise BuildError(f"--medusa-dir {src}: not a folder")
    heads, layers = medusa_shape(src)
    k = args.num_medusa_heads or heads
    if k > heads:
        raise BuildError(
            f"--num-medusa-heads {k} is larger than the checkpoint's "
            f"medusa_num_heads ({heads}) in {src / 'config.json'}"
        )
    vocab = int(model.get_output_embeddings().weight.shape[0])
    build_medusa(src, int(model.config.hidden_size), vocab)  # shape check against the target
    choices = parse_choices(args.medusa_choices) or [[0] * d for d in range(1, k + 1)]
    deep = [c for c in choices if len(c) > k]
    if deep:
        raise BuildError(f"--medusa-choices path {deep[0]} is deeper than --num-medusa-heads {k}")
    state = {
        n: t.contiguous()
        for n, t in _load_state_dict(src, "Medusa head").items()
        if int(n.split("medusa_head.", 1)[-1].split(".")[0]) < k
    }
    dst = out / "medusa"
    dst.mkdir(parents=True, exist_ok=True)
    save_file(state, str(dst / "medusa_lm_head.safetensors"))
    cfg = json.loads((src / "config.json").read_text(encoding="utf-8"))
    cfg.update(medusa_num_heads=k, medusa_num_layers=layers)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    return k, choices


def _write_eagle(
    args: argparse.Namespace, model: Any, out: Path
) -> tuple[int, list[list[int]], dict[str, Any]]:
    from safetensors.torch import save_file

    from trtspec.runtime.engine.heads import EagleDrafter, _load_state_dict

    if not args.eagle_dir:
        raise BuildError("--mode eagle needs --eagle-dir (an EAGLE checkpoint folder)")
    src = Path(args.eagle_dir)
    if not src.is_dir():
        raise BuildError(f"--eagle-dir {src}: not a folder")
    EagleDrafter(src, model)  # shape check against the target
    layers = args.num_eagle_layers or 4
    choices = parse_choices(args.eagle_choices) or [[0] * d for d in range(1, layers + 1)]
    dst = out / "eagle"
    dst.mkdir(parents=True, exist_ok=True)
    state = {n: t.contiguous() for n, t in _load_state_dict(src, "EAGLE").items()}
    save_file(state, str(dst / "model.safetensors"))
    net = json.loads((src / "config.json").read_text(encoding="utf-8"))
    (dst / "config.json").write_text(json.dumps(net, indent=2) + "\n", encoding="utf-8")
    return layers, choices, net


def build(args: argparse.Namespace) -> Path:
    out = Path(args.output)
    if args.max_input_len < 1 or args.max_seq_len <= args.max_input_len - 1:
        raise BuildError(
            f"--max-seq-len ({args.max_seq_len}) must be larger than "
            f"--max-input-len ({args.max_input_len})"
        )
    if args.mode != "lookahead" and args.lookahead:
        raise BuildError("--lookahead is only valid with --mode lookahead")
    lookahead = None
    max_draft = args.max_draft_len
    if args.mode == "lookahead":
        try:
            w, n, g = (int(x) for x in (args.lookahead or "").split(","))
        except ValueError:
            raise BuildError(f"--lookahead {args.lookahead!r}: expected W,N,G e.g. 4,3,4") from None
        check_lookahead(w, n, g)
        derived = lookahead_max_draft_len(w, n, g)
        if max_draft not in (0, derived):
            raise BuildError(
                f"--max-draft-len {max_draft} does not match lookahead ({w},{n},{g}),"
                f" which needs (N==1?0:N-2)+(W-1+G)*(N-1) = {derived}"
            )
        lookahead, max_draft = (w, n, g), derived
    if args.mode == "draft_tokens_external" and max_draft < 1:
        raise BuildError("--mode draft_tokens_external needs --max-draft-len >= 1")
    if args.mode == "none":
        max_draft = 0
    if args.mode == "medusa" and not args.medusa_dir:
        raise BuildError("--mode medusa needs --medusa-dir (a medusa_lm_head checkpoint folder)")
    if args.mode == "eagle" and not args.eagle_dir:
        raise BuildError("--mode eagle needs --eagle-dir (an EAGLE checkpoint folder)")

    model, tokenizer = load_source(args.model)
    out.mkdir(parents=True, exist_ok=True)
    medusa_choices = eagle_choices = None
    heads = eagle_layers = 0
    net: dict[str, Any] | None = None
    if args.mode == "medusa":
        heads, medusa_choices = _write_medusa(args, model, out)
        if max_draft and len(medusa_choices) > max_draft:
            raise BuildError(
                f"--medusa-choices has {len(medusa_choices)} nodes, more than "
                f"--max-draft-len {max_draft}"
            )
        max_draft = len(medusa_choices)
    if args.mode == "eagle":
        eagle_layers, eagle_choices, net = _write_eagle(args, model, out)
        if max_draft and len(eagle_choices) > max_draft:
            raise BuildError(
                f"--eagle-choices has {len(eagle_choices)} nodes, more than "
                f"--max-draft-len {max_draft}"
            )
        max_draft = max_draft or len(eagle_choices)

    model.save_pretrained(str(out / "hf"), safe_serialization=True)
    tokenizer.save_pretrained(str(out / "tokenizer"))
    cfg = model.config
    doc = build_config_document(
        mode=args.mode,
        architecture=(cfg.architectures or [type(model).__name__])[0],
        vocab_size=int(model.get_output_embeddings().weight.shape[0]),
        hidden_size=int(cfg.hidden_size),
        num_layers=int(cfg.num_hidden_layers),
        max_batch_size=args.max_batch_size,
        max_input_len=args.max_input_len,
        max_seq_len=args.max_seq_len,
        max_draft_len=max_draft,
        dtype=args.dtype,
        quantization=args.quantization,
        lookahead=lookahead,
        medusa_choices=medusa_choices,
        num_medusa_heads=heads,
        eagle_choices=eagle_choices,
        num_eagle_layers=eagle_layers,
        eagle_net_config=net,
    )
    atomic_write_json(out / "config.json", doc)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.output)
    existed = out.exists()
    try:
        try:
            build(args)
        except OSError as exc:  # a full disk, a read-only or forbidden folder
            if exc.filename is None:  # a failed flush or close names no file
                exc.filename = str(out)
            raise os_error(exc) or exc from None
    except (TrtspecError, EngineError) as exc:
        if not existed and out.exists() and not (out / "config.json").exists():
            shutil.rmtree(out, ignore_errors=True)
        print(f"Error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"Hint: {exc.hint}", file=sys.stderr)
        return 1
    print(f"built {args.mode} reference engine in {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
