"""``python -m trtspec.build.reference``: engine folders shaped like TensorRT-LLM's.

Checks the folder layout and the TRT-LLM-shaped config.json per mode, the
lookahead formula, reading configs back (with clear errors), and the exact
error messages for bad flags and checkpoints.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trtspec.build.reference import main
from trtspec.catalogue import lookahead_max_draft_len
from trtspec.runtime.engine.config import (
    EngineError,
    parse_choices,
    read_engine_config,
)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def base(model: Path, out: Path, mode: str, *extra: str) -> list[str]:
    return [
        "--model",
        str(model),
        "--output",
        str(out),
        "--mode",
        mode,
        "--max-batch-size",
        "2",
        "--max-input-len",
        "128",
        "--max-seq-len",
        "256",
        "--dtype",
        "float32",
        *extra,
    ]


def test_lookahead_formula_matches_trtllm() -> None:
    assert lookahead_max_draft_len(7, 7, 7) == 83
    assert lookahead_max_draft_len(4, 3, 4) == 15
    assert lookahead_max_draft_len(1, 1, 0) == 0


def test_choices_parse_both_formats() -> None:
    assert parse_choices("{0}, {0, 0}, {1}") == [[0], [0, 0], [1]]
    assert parse_choices("[[0], [1, 2]]") == [[0], [1, 2]]
    assert parse_choices("${medusa_choices}") is None
    with pytest.raises(EngineError) as err:
        parse_choices("[[0], []]")
    assert str(err.value) == (
        "invalid choices '[[0], []]': expected a list of non-empty lists of non-negative "
        "integers, e.g. [[0], [0, 0], [1]]"
    )


def test_target_engine_layout_and_config(tiny_llama: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "target"
    code, stdout, stderr = run(capsys, *base(tiny_llama, out, "none"))
    assert code == 0, stderr
    assert stdout == ""
    assert f"built none reference engine in {out}" in stderr
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "hf", "tokenizer"]
    assert (out / "hf" / "model.safetensors").is_file()
    assert (out / "tokenizer" / "tokenizer.json").is_file()
    tok_files = {p.name for p in (out / "tokenizer").iterdir()}
    assert (
        "chat_template.jinja" in tok_files
        or "chat_template" in (out / "tokenizer" / "tokenizer_config.json").read_text()
    )
    doc = json.loads((out / "config.json").read_text())
    assert set(doc) == {"version", "pretrained_config", "build_config", "trtspec"}
    build = doc["build_config"]
    assert build["speculative_decoding_mode"] == 1
    assert build["max_draft_len"] == 0
    assert (build["max_batch_size"], build["max_input_len"], build["max_seq_len"]) == (2, 128, 256)
    assert doc["pretrained_config"]["architecture"] == "LlamaForCausalLM"
    assert doc["pretrained_config"]["vocab_size"] == 384
    assert doc["trtspec"] == {
        "backend": "reference",
        "quantization": "none",
        "lookahead": None,
        "medusa_choices": None,
        "eagle_choices": None,
    }


def test_gguf_source_builds_the_same_engine(tiny_llama: Path, tmp_path: Path, capsys) -> None:
    """A .gguf source (llama.cpp's layout, written by the fixture) becomes an engine
    that decodes exactly like the one built from the Hugging Face folder."""
    from tests.fixtures.tiny_gguf import write_tiny_gguf

    from trtspec.runtime.engine import GenerationRequest, ReferenceEngine

    gguf = write_tiny_gguf(tiny_llama, tmp_path / "src" / "tiny.gguf")
    out = tmp_path / "from_gguf"
    code, _, stderr = run(capsys, *base(gguf, out, "draft_tokens_external", "--max-draft-len", "4"))
    assert code == 0, stderr
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "hf", "tokenizer"]
    doc = json.loads((out / "config.json").read_text())
    assert doc["pretrained_config"]["architecture"] == "LlamaForCausalLM"
    assert doc["pretrained_config"]["vocab_size"] == 384
    assert doc["build_config"]["speculative_decoding_mode"] == 2
    hf_cfg = json.loads((out / "hf" / "config.json").read_text())
    assert "quantization_config" not in hf_cfg  # the GGUF "quantizer" tag is not kept
    ref = tmp_path / "from_hf"
    assert run(capsys, *base(tiny_llama, ref, "none"))[0] == 0
    from transformers import AutoTokenizer

    text = "def fibonacci(n):\n    return n"
    assert AutoTokenizer.from_pretrained(str(out / "tokenizer")).encode(
        text
    ) == AutoTokenizer.from_pretrained(str(tiny_llama)).encode(text)
    prompt = list(range(5, 30))
    want = ReferenceEngine.load(ref, threads=1).generate(GenerationRequest(prompt, 12)).output_ids
    engine = ReferenceEngine.load(out, threads=1)
    assert engine.generate(GenerationRequest(prompt, 12)).output_ids == want
    # and it verifies drafts: the true continuation is accepted whole
    gen = engine.generate(GenerationRequest(prompt, 4, draft_ids=want[:3]))
    assert gen.output_ids == want[:4] and gen.total_accepted_draft_tokens == 3


def test_speculative_engine_configs(tiny_llama: Path, tmp_path: Path, capsys) -> None:
    from tests.fixtures.spec_checkpoints import make_eagle_checkpoint, make_medusa_checkpoint

    code, _, err = run(
        capsys, *base(tiny_llama, tmp_path / "la", "lookahead", "--lookahead", "4,3,4")
    )
    assert code == 0, err
    cfg = read_engine_config(tmp_path / "la")
    assert (cfg.mode, cfg.max_draft_len, cfg.lookahead) == ("lookahead", 15, (4, 3, 4))
    assert cfg.raw["build_config"]["speculative_decoding_mode"] == 8
    assert cfg.max_seq_len == 256 + 15  # TRT-LLM grows max_seq_len by max_draft_len

    code, _, err = run(
        capsys,
        *base(
            tiny_llama,
            tmp_path / "dte",
            "draft_tokens_external",
            "--max-draft-len",
            "6",
            "--quantization",
            "int8",
        ),
    )
    assert code == 0, err
    cfg = read_engine_config(tmp_path / "dte")
    assert (cfg.mode, cfg.max_draft_len, cfg.quantization) == ("draft_tokens_external", 6, "int8")
    assert cfg.raw["build_config"]["speculative_decoding_mode"] == 2

    medusa = make_medusa_checkpoint(tmp_path / "m_ckpt", tiny_llama, num_heads=4)
    code, _, err = run(
        capsys,
        *base(
            tiny_llama,
            tmp_path / "medusa",
            "medusa",
            "--medusa-dir",
            str(medusa),
            "--num-medusa-heads",
            "2",
            "--medusa-choices",
            "{0}, {0, 0}, {1}",
        ),
    )
    assert code == 0, err
    cfg = read_engine_config(tmp_path / "medusa")
    assert (cfg.mode, cfg.max_draft_len, cfg.num_medusa_heads) == ("medusa", 3, 2)
    assert cfg.medusa_choices == [[0], [0, 0], [1]]
    assert cfg.raw["build_config"]["speculative_decoding_mode"] == 4
    heads = json.loads((tmp_path / "medusa" / "medusa" / "config.json").read_text())
    assert heads["medusa_num_heads"] == 2
    from safetensors.torch import load_file

    keys = set(load_file(str(tmp_path / "medusa" / "medusa" / "medusa_lm_head.safetensors")))
    assert keys == {
        "0.0.linear.weight",
        "0.0.linear.bias",
        "0.1.weight",
        "1.0.linear.weight",
        "1.0.linear.bias",
        "1.1.weight",
    }

    eagle = make_eagle_checkpoint(tmp_path / "e_ckpt", tiny_llama)
    code, _, err = run(
        capsys,
        *base(
            tiny_llama,
            tmp_path / "eagle",
            "eagle",
            "--eagle-dir",
            str(eagle),
            "--num-eagle-layers",
            "2",
        ),
    )
    assert code == 0, err
    cfg = read_engine_config(tmp_path / "eagle")
    assert (cfg.mode, cfg.num_eagle_layers, cfg.eagle_choices) == ("eagle", 2, [[0], [0, 0]])
    assert cfg.raw["build_config"]["speculative_decoding_mode"] == 32
    assert cfg.raw["pretrained_config"]["eagle_net_config"]["num_hidden_layers"] == 1


@pytest.mark.parametrize(
    ("extra", "mode", "message"),
    [
        (
            ["--lookahead", "4,3,4", "--max-draft-len", "10"],
            "lookahead",
            "Error: --max-draft-len 10 does not match lookahead (4,3,4), which needs "
            "(N==1?0:N-2)+(W-1+G)*(N-1) = 15\n",
        ),
        (
            ["--lookahead", "2,1,1"],
            "lookahead",
            "Error: Invalid lookahead config (W=2, N=1, G=1): N == 1 requires W == 1 and G == 0\n",
        ),
        (
            ["--lookahead", "four"],
            "lookahead",
            "Error: --lookahead 'four': expected W,N,G e.g. 4,3,4\n",
        ),
        (
            [],
            "draft_tokens_external",
            "Error: --mode draft_tokens_external needs --max-draft-len >= 1\n",
        ),
        (
            [],
            "medusa",
            "Error: --mode medusa needs --medusa-dir (a medusa_lm_head checkpoint folder)\n",
        ),
        (
            ["--lookahead", "4,3,4"],
            "none",
            "Error: --lookahead is only valid with --mode lookahead\n",
        ),
    ],
)
def test_bad_flags(tiny_llama: Path, tmp_path: Path, capsys, *, extra, mode, message) -> None:
    out = tmp_path / "out"
    code, stdout, stderr = run(capsys, *base(tiny_llama, out, mode, *extra))
    assert (code, stdout, stderr) == (1, "", message)
    assert not out.exists()


def test_bad_sources(tmp_path: Path, capsys, tiny_llama: Path) -> None:
    code, _, err = run(capsys, *base(tmp_path / "nope", tmp_path / "o", "none"))
    assert (code, err) == (
        1,
        f"Error: --model {tmp_path / 'nope'}: no such file or folder\n"
        "Hint: give a local Hugging Face model folder or a .gguf file\n",
    )
    (tmp_path / "weights.bin").write_bytes(b"x")
    code, _, err = run(capsys, *base(tmp_path / "weights.bin", tmp_path / "o", "none"))
    assert (code, err) == (
        1,
        f"Error: --model {tmp_path / 'weights.bin'}: a file source must "
        "be a .gguf file\nHint: or give a Hugging Face model folder\n",
    )
    from tests.fixtures.spec_checkpoints import make_medusa_checkpoint

    medusa = make_medusa_checkpoint(tmp_path / "m", tiny_llama, num_heads=2)
    code, _, err = run(
        capsys,
        *base(
            tiny_llama,
            tmp_path / "o",
            "medusa",
            "--medusa-dir",
            str(medusa),
            "--num-medusa-heads",
            "3",
        ),
    )
    assert (code, err) == (
        1,
        f"Error: --num-medusa-heads 3 is larger than the checkpoint's "
        f"medusa_num_heads (2) in {medusa / 'config.json'}\n",
    )
    assert not (tmp_path / "o").exists()


def test_read_engine_config_errors(tmp_path: Path) -> None:
    with pytest.raises(EngineError) as err:
        read_engine_config(tmp_path)
    assert str(err.value) == f"{tmp_path / 'config.json'}: no engine config.json found"
    (tmp_path / "config.json").write_text(
        json.dumps({"version": "1.1.0", "pretrained_config": {}, "build_config": {}})
    )
    with pytest.raises(EngineError) as err:
        read_engine_config(tmp_path)
    assert str(err.value) == (
        f"{tmp_path / 'config.json'}: not a reference engine "
        '(no "trtspec": {"backend": "reference"})'
    )
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "pretrained_config": {"vocab_size": 3},
                "trtspec": {"backend": "reference"},
                "build_config": {"speculative_decoding_mode": 16},
            }
        )
    )
    with pytest.raises(EngineError) as err:
        read_engine_config(tmp_path)
    assert str(err.value) == (
        f"{tmp_path / 'config.json'}: build_config.speculative_decoding_mode"
        " 16 is not supported by the reference backend "
        "(supported: 1, 2, 4, 32, 8)"
    )


def test_runs_as_a_module_with_the_documented_argv(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "trtspec.build.reference",
            "--model",
            str(tmp_path / "missing"),
            "--output",
            str(tmp_path / "o"),
            "--mode",
            "none",
            "--max-draft-len",
            "0",
            "--max-batch-size",
            "1",
            "--max-input-len",
            "8",
            "--max-seq-len",
            "16",
            "--dtype",
            "float32",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.startswith(f"Error: --model {tmp_path / 'missing'}: no such file")
