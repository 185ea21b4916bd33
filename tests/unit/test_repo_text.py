"""trtspec.repo.models.text: the tokenizer the pre/postprocessing models load
(a real byte-level BPE trained by the shared fixture code) and incremental
detokenization that never splits a multi-byte character."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.fixtures.tiny_model import train_tokenizer

from trtspec.repo.models.text import REPLACEMENT, IncrementalText, Tokenizer

TEXT = "Hello! Ünïcödé — 你好 — ✓ def f(x):\n    return x"


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tok")
    train_tokenizer(folder)
    return folder


def test_tokenizer_round_trip_and_special_ids(tokenizer_dir: Path) -> None:
    tok = Tokenizer(tokenizer_dir)
    ids = tok.encode(TEXT)
    assert tok.decode(ids) == TEXT
    assert tok._fast is not None  # the light `tokenizers` path, no transformers import
    assert tok.end_id == tok._fast.token_to_id("<|im_end|>")
    assert tok.pad_id == tok._fast.token_to_id("<|endoftext|>")
    # special tokens are dropped on decode
    assert tok.decode([*ids, tok.end_id]) == TEXT


def test_streaming_one_token_at_a_time_never_emits_broken_characters(
    tokenizer_dir: Path,
) -> None:
    tok = Tokenizer(tokenizer_dir)
    ids = tok.encode(TEXT)
    stream = IncrementalText(tok.decode)
    deltas = [stream.push([t]) for t in ids]
    deltas.append(stream.flush())
    assert "".join(deltas) == TEXT
    assert not any(REPLACEMENT in d for d in deltas)
    # some token of a multi-byte character had to be held back
    partial = [tok.decode(ids[: i + 1]).endswith(REPLACEMENT) for i in range(len(ids))]
    assert any(partial)
    assert "" in deltas[:-1]


def test_bytes_that_never_complete_are_flushed_at_the_end(tokenizer_dir: Path) -> None:
    tok = Tokenizer(tokenizer_dir)
    first_byte_of_ni = tok.encode("你")[:1]  # an incomplete UTF-8 sequence on its own
    stream = IncrementalText(tok.decode)
    assert stream.push(tok.encode("ok ")) == "ok "
    assert stream.push(first_byte_of_ni) == ""
    assert stream.flush() == tok.decode(tok.encode("ok ") + first_byte_of_ni)[3:]


def test_whole_text_without_streaming(tokenizer_dir: Path) -> None:
    tok = Tokenizer(tokenizer_dir)
    stream = IncrementalText(tok.decode)
    stream.ids.extend(tok.encode(TEXT))
    assert stream.flush() == TEXT
    assert stream.flush() == ""
