"""The engine's speed paths: oneDNN-packed linears and the lean fused decoder forward.

Both must compute what the plain Hugging Face model computes: the packed
linear against ``F.linear`` for every row count (padding must not leak), the
fused forward's logits against the model's own forward for a prefill, one
cached step, a cached chain and a tree mask, on Llama (tied embeddings) and
on Qwen2 (q/k/v biases, untied head), and an unsupported model keeps the
Hugging Face forward.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from trtspec.runtime.engine import fastpath
from trtspec.runtime.engine.kv_reuse import cache_kwarg, make_cache
from trtspec.runtime.engine.loader import onednn_enabled, pack_linear, pack_linears

needs_onednn = pytest.mark.skipif(not onednn_enabled(), reason="oneDNN not available")


def _tiny_qwen2(*, tied: bool = False):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(3)
    cfg = Qwen2Config(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=tied,
        attn_implementation="sdpa",
    )
    return Qwen2ForCausalLM(cfg).eval()


def _tiny_llama(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float32, attn_implementation="sdpa"
    ).eval()


def _hf_logits(model, prefix: list[int], tokens: list[int], mask=None, positions=None):
    cache = make_cache(hf=True)
    kw = {cache_kwarg(model): cache, "use_cache": True}
    with torch.inference_mode():
        if prefix:
            model(input_ids=torch.tensor([prefix]), **kw)
        if mask is not None:
            kw["attention_mask"] = mask
        if positions is not None:
            kw["position_ids"] = positions
        return model(input_ids=torch.tensor([tokens]), **kw).logits[0]


def _fast_logits(
    model, prefix: list[int], tokens: list[int], mask=None, positions=None, *, hf_cache=False
):
    cache = make_cache(hf=hf_cache)
    with torch.inference_mode():
        if prefix:
            fastpath.forward(model, torch.tensor([prefix]), cache)
        assert cache.get_seq_length() == len(prefix)
        hidden = fastpath.forward(
            model, torch.tensor([tokens]), cache, attention_mask=mask, position_ids=positions
        )
        assert cache.get_seq_length() == len(prefix) + len(tokens)
        return model.lm_head(hidden)


def _tree_mask(past: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Root + two sibling children + one grandchild under the first child."""
    parents = [-1, 0, 0, 1]  # row 0 is the root token, rows 1..3 the tree
    q = len(parents)
    allowed = torch.zeros(q, past + q, dtype=torch.bool)
    allowed[:, :past] = True
    depth = []
    for row, parent in enumerate(parents):
        j = row
        while j >= 0:
            allowed[row, past + j] = True
            j = parents[j]
        depth.append(0 if parent < 0 else depth[parent] + 1)
    mask = torch.zeros(q, past + q).masked_fill_(~allowed, torch.finfo(torch.float32).min)
    return mask[None, None], torch.tensor([[past + d for d in depth]])


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_fused_forward_matches_the_model_forward(family: str, tiny_llama: Path) -> None:
    reference = _tiny_llama(tiny_llama) if family == "llama" else _tiny_qwen2()
    fused = copy.deepcopy(reference)
    assert fastpath.fuse(fused)
    assert fastpath.is_fused(fused) and not hasattr(fused.model.layers[0].self_attn, "q_proj")
    pack_linears(fused)
    prefix = [5, 17, 33, 2, 99, 41, 7]
    mask, positions = _tree_mask(len(prefix))
    cases = [
        ([], prefix, None, None),  # prefill, causal
        (prefix, [12], None, None),  # one cached step
        (prefix, [12, 80, 3], None, None),  # a cached chain (verification)
        (prefix, [12, 80, 3, 64], mask, positions),  # a tree
    ]
    for past, tokens, m, pos in cases:
        want = _hf_logits(reference, past, tokens, m, pos)
        got = _fast_logits(fused, past, tokens, m, pos)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
        assert torch.equal(got.argmax(-1), want.argmax(-1))
        # the lean KVCache and transformers' DynamicCache hold the same tensors
        assert torch.equal(got, _fast_logits(fused, past, tokens, m, pos, hf_cache=True))


def test_fastpath_declines_what_it_cannot_reproduce(tiny_llama: Path, monkeypatch) -> None:
    model = _tiny_llama(tiny_llama)
    assert fastpath.supports(model)
    monkeypatch.setenv("TRTSPEC_ENGINE_FASTPATH", "0")
    assert not fastpath.supports(model) and not fastpath.fuse(model)
    monkeypatch.delenv("TRTSPEC_ENGINE_FASTPATH")
    gelu = copy.deepcopy(model)
    gelu.config.hidden_act = "gelu"
    assert not fastpath.supports(gelu)
    other = copy.deepcopy(model)
    other.config.model_type = "gpt2"
    assert not fastpath.supports(other)


@needs_onednn
def test_packed_linear_equals_f_linear_for_every_row_count() -> None:
    torch.manual_seed(0)
    for bias in (False, True):
        linear = torch.nn.Linear(48, 80, bias=bias)
        packed = pack_linear(copy.deepcopy(linear))
        assert type(packed).__name__ == "PackedLinear"
        assert packed.weight.device.type == "meta"  # nobody else holds it: not kept twice
        with torch.inference_mode():
            for rows in (1, 2, 3, 4, 5, 9):
                x = torch.randn(1, rows, 48)
                got = packed(x)
                assert got.shape == (1, rows, 80)
                torch.testing.assert_close(got, linear(x), atol=1e-5, rtol=1e-5)
            x = torch.randn(48)
            torch.testing.assert_close(packed(x), linear(x), atol=1e-5, rtol=1e-5)
            x = torch.randn(2, 48)
            torch.testing.assert_close(packed(x), linear(x), atol=1e-5, rtol=1e-5)


@needs_onednn
@pytest.mark.parametrize("tied", [True, False])
def test_pack_linears_keeps_only_shared_weights_dense(tied: bool, monkeypatch) -> None:
    model = _tiny_qwen2(tied=tied)
    n_linear = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    x = torch.tensor([[4, 9, 250, 31]])
    with torch.inference_mode():
        want = model(input_ids=x).logits
    assert pack_linears(model) == n_linear
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    head = model.get_output_embeddings()
    # a tied head keeps the embedding's dense weight; nothing else is kept twice
    assert (head.weight is model.get_input_embeddings().weight) is tied
    assert head.weight.device.type == ("cpu" if tied else "meta")
    assert model.model.layers[0].mlp.down_proj.weight.device.type == "meta"
    with torch.inference_mode():  # the Hugging Face forward still runs on packed layers
        torch.testing.assert_close(model(input_ids=x).logits, want, atol=2e-5, rtol=1e-4)
    monkeypatch.setenv("TRTSPEC_ENGINE_ONEDNN", "0")
    assert pack_linears(_tiny_qwen2()) == 0


def _mapped(path: Path) -> bool:
    return any(str(path) in line for line in Path("/proc/self/maps").read_text().splitlines())


def test_loaded_weights_leave_the_file_but_the_embedding_maps_it(tiny_llama, tmp_path) -> None:
    # issue 24: after packing, the stub keeps no mapping of the whole weight file,
    # the input embedding reads its rows from the file (page cache), and the
    # logits are the model's own
    import gc
    import shutil

    from trtspec.runtime.engine.loader import map_input_embeddings, own_weights

    folder = tmp_path / "hf"
    shutil.copytree(tiny_llama, folder)
    file = folder / "model.safetensors"
    reference = _tiny_llama(tiny_llama)
    model = _tiny_llama(folder)
    fastpath.fuse(model)
    pack_linears(model)
    mapped = map_input_embeddings(model, file)
    assert mapped is not None
    assert model.get_input_embeddings().weight.data_ptr() == mapped.data_ptr()
    assert torch.equal(mapped, reference.get_input_embeddings().weight)
    copied = own_weights(model, keep=mapped)
    assert 0 < copied < file.stat().st_size
    gc.collect()
    maps = [ln for ln in Path("/proc/self/maps").read_text().splitlines() if str(file) in ln]
    assert len(maps) == 1, maps  # the embedding's own mapping, not the whole file's
    start, end = (int(x, 16) for x in maps[0].split()[0].split("-"))
    assert end - start < file.stat().st_size
    prompt = [5, 17, 99, 3, 42]
    torch.testing.assert_close(
        _fast_logits(model, [], prompt), _hf_logits(reference, [], prompt), rtol=1e-4, atol=1e-4
    )
    del model, mapped
    gc.collect()
    assert not _mapped(file)


def test_an_embedding_the_file_does_not_hold_stays_as_loaded(tiny_llama, tmp_path) -> None:
    from trtspec.runtime.engine.loader import map_input_embeddings

    model = _tiny_qwen2()  # built in memory: its weights are not those of tiny_llama's file
    before = model.get_input_embeddings().weight.data_ptr()
    assert map_input_embeddings(model, tiny_llama / "model.safetensors") is None
    assert map_input_embeddings(model, tmp_path / "missing.safetensors") is None
    assert model.get_input_embeddings().weight.data_ptr() == before
