"""The lean loader (runtime/engine/lean_model.py) and the engine's own KV cache.

A model loaded without transformers must be the Hugging Face-loaded one bit
for bit: the rotary tables against the installed transformers' default RoPE,
and the fused forward's logits (prefill, cached step, chain, tree) of
``load_target`` with and without the lean loader, float32 packed and int8, on
Llama (untied; tied with attention and MLP biases), Qwen2 (q/k/v biases) and
Mistral; the reference engine's greedy tokens and their logits likewise. An
engine stub loading a supported model in a fresh interpreter imports no
transformers at all; whatever the lean model would not reproduce exactly
(rope scaling, sliding windows, unexpected tensors, EAGLE) takes the Hugging
Face path; without the fast path the engine still runs the Hugging Face
forward over transformers' ``DynamicCache``.
"""

from __future__ import annotations

import gc
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from trtspec.runtime.engine import fastpath, lean_model
from trtspec.runtime.engine.kv_reuse import KVCache, crop_cache, make_cache, select_cache
from trtspec.runtime.engine.loader import load_target, uses_lean_loader

PROMPTS = [[5, 17, 33, 2, 99, 41, 7, 250, 12], [40, 41, 42, 43, 44, 45, 40, 41]]


def _model(family: str, **overrides: Any) -> Any:
    """A tiny random ``family`` model (biases and LM head scaled to matter)."""
    import transformers

    cls_name = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral"}[family]
    config_cls = getattr(transformers, f"{cls_name}Config")
    model_cls = getattr(transformers, f"{cls_name}ForCausalLM")
    kwargs: dict[str, Any] = dict(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    kwargs.update(overrides)
    torch.manual_seed(7)
    model = model_cls(config_cls(**kwargs)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):  # zero-initialised: give them values that matter
                p.normal_(0, 0.5)
        model.get_output_embeddings().weight.mul_(4.0)
    return model


def _save(path: Path, family: str, **overrides: Any) -> Path:
    """A tiny random ``family`` model saved as ``save_pretrained`` writes it."""
    _model(family, **overrides).save_pretrained(str(path), safe_serialization=True)
    return path


@pytest.fixture(scope="module")
def folders(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lean")
    return {
        "llama": tiny_llama,
        "llama_tied_bias": _save(
            root / "llama_tb", "llama", tie_word_embeddings=True, attention_bias=True, mlp_bias=True
        ),
        "qwen2": _save(root / "qwen2", "qwen2"),
        "mistral": _save(root / "mistral", "mistral", sliding_window=None, head_dim=32),
    }


def _config(hf: Path, quantization: str | None = None, mode: str = "none") -> Any:
    return SimpleNamespace(hf_dir=hf, quantization=quantization, mode=mode)


def _both(hf: Path, quantization: str | None, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    lean = load_target(_config(hf, quantization))
    monkeypatch.setenv("TRTSPEC_ENGINE_LEAN", "0")
    ref = load_target(_config(hf, quantization))
    monkeypatch.delenv("TRTSPEC_ENGINE_LEAN")
    assert lean._trtspec_loader == "lean", getattr(lean, "_trtspec_lean_declined", "")
    assert ref._trtspec_loader == "hf" and type(ref).__module__.startswith("transformers")
    return lean, ref


def _logits(model: Any, prefix: list[int], tokens: list[int], mask=None, positions=None):
    cache = make_cache()
    with torch.inference_mode():
        if prefix:
            fastpath.forward(model, torch.tensor([prefix]), cache)
        hidden = fastpath.forward(
            model, torch.tensor([tokens]), cache, attention_mask=mask, position_ids=positions
        )
        return model.lm_head(hidden)


def _tree(past: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Root + two children + a grandchild under the first child."""
    from trtspec.runtime.engine.decode import tree_inputs

    inputs = tree_inputs(4, past, 1, [1, 1, 2], [[0], [1], [0, 2]])
    return inputs["attention_mask"], inputs["position_ids"]


@pytest.mark.parametrize(
    ("family", "quantization"),
    [
        ("llama", None),
        ("llama_tied_bias", None),
        ("llama_tied_bias", "int8"),  # the demo draft's shape: tied head, quantized
        ("qwen2", None),
        ("qwen2", "int8"),
        ("mistral", None),
    ],
)
def test_lean_model_is_the_hugging_face_model_bit_for_bit(
    folders, family: str, quantization: str | None, monkeypatch
) -> None:
    lean, ref = _both(folders[family], quantization, monkeypatch)
    assert "transformers" not in type(lean).__module__
    assert lean.config.tie_word_embeddings == ref.config.tie_word_embeddings
    assert torch.equal(lean.model.rotary_emb.inv_freq, ref.model.rotary_emb.inv_freq)
    x = torch.zeros(1, dtype=torch.float32)
    positions = torch.arange(0, 512)[None]
    lean_rope, ref_rope = lean.model.rotary_emb, ref.model.rotary_emb
    for a, b in zip(lean_rope(x, positions), ref_rope(x, positions), strict=True):
        assert torch.equal(a, b)
    prefix = PROMPTS[0]
    mask, pos = _tree(len(prefix))
    cases = [
        ([], prefix, None, None),  # prefill
        (prefix, [12], None, None),  # one cached step
        (prefix, [12, 80, 3], None, None),  # a chain (verification)
        (prefix, [12, 80, 3, 64], mask, pos),  # a tree
    ]
    for past, tokens, m, p in cases:
        assert torch.equal(_logits(lean, past, tokens, m, p), _logits(ref, past, tokens, m, p))


@pytest.fixture(scope="module")
def engines(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.fixtures.spec_checkpoints import build_engine

    root = tmp_path_factory.mktemp("lean-engines")
    return {
        "none": build_engine(tiny_llama, root / "target", "none"),
        "int8": build_engine(tiny_llama, root / "int8", "none", extra=["--quantization", "int8"]),
    }


@pytest.mark.parametrize("kind", ["none", "int8"])
def test_engine_greedy_tokens_and_logits_equal_the_hugging_face_loaded_engine(
    engines, kind: str, hf_greedy, monkeypatch
) -> None:
    from trtspec.runtime.engine.decode import GenerationRequest, ReferenceEngine

    runs = {}
    for lean in ("1", "0"):
        monkeypatch.setenv("TRTSPEC_ENGINE_LEAN", lean)
        engine = ReferenceEngine.load(engines[kind], threads=1, kv_reuse=0)
        assert engine.model._trtspec_loader == ("lean" if lean == "1" else "hf")
        runs[lean] = [
            engine.generate(GenerationRequest(p, 16, return_generation_logits=True))
            for p in PROMPTS
        ]
    for a, b in zip(runs["1"], runs["0"], strict=True):
        assert a.output_ids == b.output_ids
        pairs = zip(a.generation_logits, b.generation_logits, strict=True)
        assert all(torch.equal(x, y) for x, y in pairs)
    if kind == "none":
        assert runs["1"][0].output_ids == hf_greedy(PROMPTS[0], 16)


PROBE = """
import json, sys
from trtspec.runtime.engine.batching import BatchScheduler, serve_all
from trtspec.runtime.engine.decode import GenerationRequest, ReferenceEngine
engine = ReferenceEngine.load(sys.argv[1], threads=1)
scheduler = BatchScheduler(engine)
prompts = json.loads(sys.argv[2])
gens = serve_all(scheduler, [GenerationRequest(p, 8) for p in prompts])
scheduler.close()
print(json.dumps({
    "loader": engine.model._trtspec_loader,
    "outputs": [g.output_ids for g in gens],
    "transformers": sorted(m for m in sys.modules if m.split(".")[0] == "transformers")[:5],
}))
"""


def test_an_engine_loads_and_serves_without_importing_transformers(engines, hf_greedy) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(engines["none"]), json.dumps(PROMPTS)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["loader"] == "lean"
    assert result["transformers"] == [], f"imported {result['transformers']}"
    assert result["outputs"] == [hf_greedy(p, 8) for p in PROMPTS]


def test_without_the_fast_path_the_engine_runs_the_hugging_face_forward(
    engines, hf_greedy, monkeypatch
) -> None:
    from transformers import DynamicCache

    from trtspec.runtime.engine.decode import GenerationRequest, ReferenceEngine

    monkeypatch.setenv("TRTSPEC_ENGINE_FASTPATH", "0")
    engine = ReferenceEngine.load(engines["none"], threads=1)
    assert engine.model._trtspec_loader == "hf" and not engine._fastpath
    gen = engine.generate(GenerationRequest(PROMPTS[0], 12))
    assert gen.output_ids == hf_greedy(PROMPTS[0], 12)
    entry = engine.prefix_cache.lookup(PROMPTS[0] + gen.output_ids)[1]
    assert entry is not None  # kept for reuse, and reused as a DynamicCache
    again = engine.generate(GenerationRequest(PROMPTS[0], 12))
    assert again.reused_tokens > 0 and again.output_ids == gen.output_ids
    assert isinstance(make_cache(hf=True), DynamicCache)


def _rope_scaled(cfg: dict[str, Any]) -> None:
    cfg["rope_parameters"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}


def test_a_model_with_rope_scaling_falls_back_to_hugging_face(tiny_llama: Path, tmp_path) -> None:
    folder = tmp_path / "scaled"
    shutil.copytree(tiny_llama, folder)
    cfg = json.loads((folder / "config.json").read_text())
    _rope_scaled(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))
    model = load_target(_config(folder))
    assert model._trtspec_loader == "hf"
    assert "not a plain default RoPE" in model._trtspec_lean_declined
    assert model.model.rotary_emb.rope_type == "linear"  # transformers' own scaled RoPE
    assert fastpath.is_fused(model)


def test_eagle_and_switched_off_paths_do_not_try_the_lean_loader(monkeypatch) -> None:
    assert uses_lean_loader(_config(Path("x")))
    assert not uses_lean_loader(_config(Path("x"), mode="eagle"))
    monkeypatch.setenv("TRTSPEC_ENGINE_FASTPATH", "0")
    assert not uses_lean_loader(_config(Path("x")))
    monkeypatch.delenv("TRTSPEC_ENGINE_FASTPATH")
    monkeypatch.setenv("TRTSPEC_ENGINE_LEAN", "off")
    assert not uses_lean_loader(_config(Path("x")))


BASE = {
    "model_type": "llama",
    "hidden_act": "silu",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "vocab_size": 300,
    "tie_word_embeddings": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"model_type": "gpt2"}, "model_type"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        (
            {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 5e5}},
            "rope_parameters",
        ),
        ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4}}, "rope_type"),
        (
            {"rope_parameters": None, "rope_theta": 1e4, "rope_scaling": {"type": "linear"}},
            "rope_scaling",
        ),
        ({"rope_parameters": None}, "rope_theta"),  # nothing explicit: the family default
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
        ({"layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
        ({"model_type": "mistral"}, "sliding_window"),  # absent: transformers' 4096
        ({"model_type": "mistral", "sliding_window": 4096}, "sliding_window"),
        ({"model_type": "qwen2", "use_sliding_window": True}, "use_sliding_window"),
        ({"quantization_config": {"quant_method": "gptq"}}, "quantization_config"),
        ({"tie_word_embeddings": None}, "tie_word_embeddings"),
        ({"num_key_value_heads": None}, "num_key_value_heads"),
    ],
)
def test_configs_the_lean_model_would_not_reproduce_are_declined(change, reason) -> None:
    cfg = {**BASE, **change}
    if change.get("tie_word_embeddings", False) is None:
        del cfg["tie_word_embeddings"]
    with pytest.raises(lean_model.Unsupported, match=reason):
        lean_model.lean_config(cfg)


def test_the_older_config_format_and_each_familys_biases_are_read() -> None:
    legacy = {**BASE, "rope_theta": 500000.0, "rope_scaling": None}
    del legacy["rope_parameters"]
    cfg = lean_model.lean_config(legacy)
    assert cfg.rope_theta == 500000.0 and cfg.head_dim == 16
    qwen = lean_model.lean_config({**BASE, "model_type": "qwen2"})
    assert (qwen.qkv_bias, qwen.o_bias, qwen.mlp_bias) == (True, False, False)
    names = lean_model.expected_tensors(qwen)
    assert "model.layers.1.self_attn.k_proj.bias" in names and "lm_head.weight" in names
    assert "model.layers.1.self_attn.o_proj.bias" not in names


def test_a_weight_file_that_does_not_match_is_declined(tiny_llama: Path, tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    cfg = lean_model.lean_config(json.loads((tiny_llama / "config.json").read_text()))
    shapes = lean_model.expected_tensors(cfg)
    state = load_file(str(tiny_llama / "model.safetensors"))
    assert lean_model.read_tensors(tiny_llama / "model.safetensors", shapes).keys() == state.keys()
    variants = {
        "unexpected": {**state, "model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8)},
        "missing": {k: v for k, v in state.items() if k != "lm_head.weight"},
        "float32": {**state, "model.norm.weight": state["model.norm.weight"].half()},
        "shape": {**state, "model.norm.weight": torch.ones(3)},
    }
    for reason, tensors in variants.items():
        file = tmp_path / f"{reason}.safetensors"
        save_file(tensors, str(file))
        with pytest.raises(lean_model.Unsupported, match=reason):
            lean_model.read_tensors(file, shapes)


def test_lean_weights_leave_the_file_but_the_embedding_maps_it(tiny_llama, tmp_path) -> None:
    folder = tmp_path / "hf"
    shutil.copytree(tiny_llama, folder)
    file = str(folder / "model.safetensors")
    model = load_target(_config(folder))
    assert model._trtspec_loader == "lean"
    gc.collect()
    maps = [ln for ln in Path("/proc/self/maps").read_text().splitlines() if file in ln]
    assert len(maps) == 1, maps  # the embedding's own mapping, not the whole file's
    del model
    gc.collect()
    assert not any(file in ln for ln in Path("/proc/self/maps").read_text().splitlines())


def test_the_engine_cache_keeps_its_kind_through_crop_and_select() -> None:
    from transformers import DynamicCache

    kv = [(torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)) for _ in range(3)]
    for hf in (False, True):
        cache = make_cache(kv, hf=hf)
        assert isinstance(cache, DynamicCache if hf else KVCache)
        assert cache.get_seq_length() == 5
        cropped = crop_cache(cache, 3)
        picked = select_cache(cache, torch.tensor([0, 2, 4]))
        for c, n in ((cropped, 3), (picked, 3)):
            assert type(c) is type(cache) and c.get_seq_length() == n
        assert torch.equal(picked.layers[1].values, kv[1][1][:, :, [0, 2, 4]])
    assert make_cache().get_seq_length() == 0 and make_cache().layers == []


@pytest.mark.parametrize("tied", [False, True])
def test_int8_quantization_is_quantize_dynamics_bit_for_bit(tied: bool) -> None:
    import copy
    import warnings

    from trtspec.runtime.engine.loader import quantize_int8

    model = _model("qwen2", tie_word_embeddings=tied)
    want = copy.deepcopy(model)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # the reference on two threads, ours on one (as loaded)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

            spec = {torch.nn.Linear: per_channel_dynamic_qconfig}
            quantize_dynamic(want, spec, dtype=torch.qint8, inplace=True)
        torch.set_num_threads(1)
        got = quantize_int8(model)
    finally:
        torch.set_num_threads(threads)
    ours = dict(got.named_modules())
    swapped = 0
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    for name, ref in want.named_modules():
        if not isinstance(ref, DynamicLinear):
            continue
        mine = ours[name]
        assert type(mine) is type(ref) and mine.version == ref.version == 4
        assert (mine.in_features, mine.out_features) == (ref.in_features, ref.out_features)
        (w1, b1), (w2, b2) = mine._weight_bias(), ref._weight_bias()
        assert torch.equal(w1.int_repr(), w2.int_repr())
        assert torch.equal(w1.q_per_channel_scales(), w2.q_per_channel_scales())
        assert torch.equal(w1.q_per_channel_zero_points(), w2.q_per_channel_zero_points())
        assert (b1 is None and b2 is None) or torch.equal(b1, b2)
        swapped += 1
    assert swapped == 2 * 7 + 1  # every projection and the LM head
    assert not any(type(m) is torch.nn.Linear for m in got.modules())
    ids = torch.tensor([[4, 9, 250, 31, 7, 7, 120]])
    with torch.inference_mode():
        assert torch.equal(got(input_ids=ids).logits, want(input_ids=ids).logits)
