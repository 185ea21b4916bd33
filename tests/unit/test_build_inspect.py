"""``trtspec inspect`` on an engine folder shaped like a public TensorRT-LLM
0.17 engine (config.json = {version, pretrained_config, build_config})."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from trtspec.build.inspect import mode_name, read_engine
from trtspec.cli.main import cli
from trtspec.errors import TrtspecError


def engine_017(folder: Path, mode: int = 1, max_draft_len: int = 0) -> Path:
    """Mirror the layout of a trtllm-build 0.17.0.post1 engine config.json."""
    folder.mkdir(parents=True)
    config = {
        "version": "0.17.0.post1",
        "pretrained_config": {
            "mlp_bias": False,
            "attn_bias": False,
            "rotary_base": 10000.0,
            "architecture": "LlamaForCausalLM",
            "dtype": "float16",
            "vocab_size": 32000,
            "hidden_size": 4096,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 32,
            "max_position_embeddings": 2048,
            "mapping": {
                "world_size": 1,
                "gpus_per_node": 8,
                "cp_size": 1,
                "tp_size": 1,
                "pp_size": 1,
                "moe_tp_size": 1,
                "moe_ep_size": 1,
            },
            "quantization": {
                "quant_algo": None,
                "kv_cache_quant_algo": None,
                "group_size": 128,
                "has_zero_point": False,
            },
        },
        "build_config": {
            "max_input_len": 1536,
            "max_seq_len": 2048 + max_draft_len,
            "opt_batch_size": 8,
            "max_batch_size": 4,
            "max_beam_width": 1,
            "max_num_tokens": 4096,
            "opt_num_tokens": 4,
            "max_prompt_embedding_table_size": 0,
            "kv_cache_type": "PAGED",
            "gather_context_logits": False,
            "gather_generation_logits": False,
            "strongly_typed": True,
            "max_draft_len": max_draft_len,
            "speculative_decoding_mode": mode,
            "use_refit": False,
            "output_timing_cache": "model.cache",
            "plugin_config": {
                "dtype": "float16",
                "bert_attention_plugin": "auto",
                "gpt_attention_plugin": "auto",
                "gemm_plugin": "float16",
                "context_fmha": True,
                "remove_input_padding": True,
                "paged_kv_cache": True,
                "tokens_per_block": 64,
                "use_paged_context_fmha": False,
            },
        },
    }
    (folder / "config.json").write_text(json.dumps(config, indent=4))
    (folder / "rank0.engine").write_bytes(b"\0" * 16)
    return folder


def test_read_engine_summary(tmp_path: Path) -> None:
    info = read_engine(engine_017(tmp_path / "target_dte", mode=2, max_draft_len=8))
    assert info["speculative_decoding_mode"] == 2
    assert info["speculative_mode_name"] == "draft_tokens_external"
    assert info["max_draft_len"] == 8 and info["max_seq_len"] == 2056
    assert info["plugins"]["tokens_per_block"] == 64
    assert info["plugins"]["use_paged_context_fmha"] is False
    assert info["files"] == ["config.json", "rank0.engine"]
    assert info["trtllm_version"] == "0.17.0.post1" and info["tp_size"] == 1
    assert "manifest" not in info


@pytest.mark.parametrize(
    ("value", "name"),
    [
        (1, "none"),
        (2, "draft_tokens_external"),
        (4, "medusa"),
        (8, "lookahead_decoding"),
        (16, "explicit_draft_tokens"),
        (32, "eagle"),
        (64, "unknown(64)"),
    ],
)
def test_mode_enum(value: int, name: str) -> None:
    assert mode_name(value) == name


def test_inspect_cli_table_and_json(tmp_path: Path) -> None:
    folder = engine_017(tmp_path / "target_medusa_m", mode=4, max_draft_len=63)
    (folder / "trtspec.json").write_text(
        json.dumps(
            {
                "spec": "v",
                "spec_hash": "abc",
                "backend": "tensorrt_llm",
                "built_at": "now",
                "versions": {"tensorrt_llm": "0.17.0.post1"},
                "steps": [{"id": "build:target_medusa_m"}],
            }
        )
    )
    runner = CliRunner()
    res = runner.invoke(cli, ["inspect", str(folder)])
    assert res.exit_code == 0, res.output
    assert res.stderr == ""
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["field", "value"]
    rows = {parts[0]: (parts[1:] or [""])[0] for parts in (ln.split(None, 1) for ln in lines[2:])}
    assert rows["quantization"] == ""
    assert rows["speculative_decoding_mode"] == "4 (medusa)"
    assert rows["max_draft_len"] == "63"
    assert rows["manifest.steps"] == "build:target_medusa_m"
    assert rows["plugin.use_paged_context_fmha"] == "False"
    res = runner.invoke(cli, ["inspect", str(folder), "--format", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["speculative_mode_name"] == "medusa" and data["manifest"]["spec_hash"] == "abc"


def test_inspect_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(cli, ["inspect", str(tmp_path / "nope")])
    assert res.exit_code == 1
    assert res.stdout == ""
    assert res.stderr == (
        f"Error: {tmp_path / 'nope'}: no such engine folder\n"
        "Hint: pass a folder under engines/<spec>/\n"
    )
    (tmp_path / "empty").mkdir()
    res = runner.invoke(cli, ["inspect", str(tmp_path / "empty")])
    assert res.exit_code == 1
    assert res.stderr.splitlines()[0] == (
        f"Error: {tmp_path / 'empty'} is not an engine folder: config.json is missing"
    )
    (tmp_path / "empty" / "config.json").write_text("{nope")
    with pytest.raises(TrtspecError) as err:
        read_engine(tmp_path / "empty")
    assert err.value.message.startswith(f"{tmp_path / 'empty' / 'config.json'}: not valid JSON (")


def test_inspect_verifies_files_against_the_manifest(tmp_path: Path) -> None:
    from trtspec.integrity import file_records

    folder = engine_017(tmp_path / "target")
    (folder / "rank0.engine").write_bytes(b"\0" * 100)
    manifest = {
        "spec": "v",
        "engine": {"name": "target", "variants": ["baseline", "ngram"]},
        "steps": [{"id": "build:target"}],
        "files": file_records(folder),
    }
    (folder / "trtspec.json").write_text(json.dumps(manifest))
    assert read_engine(folder)["files_check"] == "ok: 2 files match trtspec.json"
    (folder / "rank0.engine").write_bytes(b"\0" * 10)
    res = CliRunner().invoke(cli, ["inspect", str(folder)])
    assert res.exit_code == 1
    assert res.stdout == ""
    assert res.stderr == (
        f"Error: {folder}: 1 file(s) no longer match its trtspec.json:\n"
        "  rank0.engine: 10 bytes, but 100 when built (truncated?)\n"
        "Hint: rebuild it: `trtspec build SPEC --force --only baseline` (SPEC: the spec file "
        "of 'v')\n"
    )
    # A manifest from before file records: unverifiable, said so, not an error.
    del manifest["files"]
    (folder / "trtspec.json").write_text(json.dumps(manifest))
    assert read_engine(folder)["files_check"] == (
        f"{folder}: its trtspec.json was written by an older trtspec and records no files, so "
        "missing or truncated files cannot be detected; `trtspec build SPEC --force` records them"
    )
