"""``python -m trtspec.build.tools``: the tokenizer-copy step on a real tokenizer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from transformers import AutoTokenizer


def test_copy_tokenizer_step(tmp_path: Path, tiny_llama: Path) -> None:
    out = tmp_path / "engine" / "tokenizer"
    proc = subprocess.run(
        [sys.executable, "-m", "trtspec.build.tools", "copy-tokenizer", "--source",
         str(tiny_llama), "--output", str(out)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("copied tokenizer.json, tokenizer_config.json")
    assert not (out / "model.safetensors").exists()
    source, copied = AutoTokenizer.from_pretrained(tiny_llama), AutoTokenizer.from_pretrained(out)
    text = "def f(x):\n    return x  # Ünïcödé"
    assert copied(text)["input_ids"] == source(text)["input_ids"]
    assert copied.chat_template == source.chat_template


def test_copy_tokenizer_without_tokenizer_fails(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "trtspec.build.tools", "copy-tokenizer", "--source",
         str(tmp_path), "--output", str(tmp_path / "out")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr == (f"error: no tokenizer files in {tmp_path} (looked for tokenizer.json, "
                           "tokenizer.model, vocab.json)\n")  # fmt: skip
