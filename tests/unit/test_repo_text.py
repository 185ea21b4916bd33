"""trtspec.runtime.text: the tokenizer the pre/postprocessing models load
(a real byte-level BPE trained by the shared fixture code) and incremental
detokenization that never splits a multi-byte character."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.fixtures.tiny_model import train_tokenizer

from trtspec.runtime.text import REPLACEMENT, IncrementalText, Tokenizer

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


SAMPLES = [TEXT, "", " leading space", "tabs\tand\nnewlines\n\n", "emoji 🙂 and ünïcödé", "x" * 300]
SMOLLM2 = Path(__file__).resolve().parents[2] / ".cache" / "models" / "smollm2-135m-instruct"


def _folders(tokenizer_dir: Path) -> list[Path]:
    return [tokenizer_dir, *([SMOLLM2] if (SMOLLM2 / "tokenizer.json").is_file() else [])]


def test_tokenizers_library_matches_transformers_both_ways(tokenizer_dir: Path) -> None:
    """The text models load tokenizer.json with `tokenizers`, not transformers:
    ids and text must be byte-identical to what transformers would give (the
    demo's SmolLM2 when `make demo` has fetched it, and the tiny tokenizer)."""
    from transformers import AutoTokenizer

    for folder in _folders(tokenizer_dir):
        light = Tokenizer(folder)
        assert light._fast is not None and light._hf is None
        hf = AutoTokenizer.from_pretrained(str(folder))
        assert (light.end_id, light.pad_id) == (
            hf.eos_token_id,
            hf.pad_token_id if hf.pad_token_id is not None else hf.eos_token_id,
        ), folder
        for text in SAMPLES:
            ids = light.encode(text)
            assert ids == hf.encode(text, add_special_tokens=True), (folder, text)
            specials = [*ids, light.end_id]
            assert light.decode(specials) == hf.decode(specials, skip_special_tokens=True)
            assert light.decode(specials).encode() == text.encode(), (folder, text)


def test_local_text_answers_what_the_text_models_answer(tokenizer_dir: Path) -> None:
    """The orchestrator's in-process text (LocalText) against the settings of
    the preprocessing (special tokens added) and postprocessing (skipped) models."""
    from trtspec.runtime.text import LocalText

    assert LocalText.of_params({}) is None
    assert LocalText.of_params({"tokenizer_dir": " "}) is None
    for folder in _folders(tokenizer_dir):
        local = LocalText.of_params({"tokenizer_dir": str(folder)})
        assert local is not None
        pre = Tokenizer(folder, add_special_tokens=True)
        post = Tokenizer(folder, skip_special_tokens=True)
        assert (local.end_id, local.pad_id) == (pre.end_id, pre.pad_id)
        for text in SAMPLES:
            ids = local.encode(text)
            assert ids == pre.encode(text)
            assert local.decode([*ids, pre.end_id]) == post.decode([*ids, pre.end_id])


def _sentencepiece_style(folder: Path) -> Tokenizer:
    """A Llama-2-style tokenizer trained here: BPE over ``▁``-marked words
    with byte fallback, a decoder that turns ``▁`` into spaces, merges the
    fallback bytes and strips the first token's leading space."""
    from tokenizers import Tokenizer as FastTokenizer
    from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

    tok = FastTokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<unk>", "<s>", "</s>", *bytes_], show_progress=False
    )
    tok.train_from_iterator([TEXT, *SAMPLES, "the quick brown fox " * 20] * 4, trainer=trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text('{"eos_token": "</s>", "pad_token": "<unk>"}')
    return Tokenizer(folder)


def _streamed(tok: Tokenizer, ids: list[int], chunks: list[int]) -> tuple[list[str], str]:
    stream = IncrementalText(tok.decode)
    deltas, at = [], 0
    for size in chunks:
        deltas.append(stream.push(ids[at : at + size]))
        at += size
    deltas.append(stream.push(ids[at:]))
    return deltas, stream.flush()


def test_window_decoding_gives_the_whole_decode(tokenizer_dir: Path, tmp_path: Path) -> None:
    """Each push decodes a few ids, not the whole output: the concatenated
    deltas equal one decode of everything, token by token and in chunks, for
    real text and for random ids (special tokens, bytes that never finish a
    character), with byte-level BPE (the tiny tokenizer, SmolLM2 when
    present) and a SentencePiece-style tokenizer (leading-space stripping,
    byte fallback)."""
    import random

    rng = random.Random(7)
    tokenizers = [Tokenizer(f) for f in _folders(tokenizer_dir)]
    tokenizers.append(_sentencepiece_style(tmp_path / "sp"))
    for tok in tokenizers:
        vocab = tok._fast.get_vocab_size()
        texts = [*SAMPLES, TEXT * 3]
        cases = [tok.encode(t) for t in texts]
        cases += [[rng.randrange(vocab) for _ in range(rng.randrange(1, 80))] for _ in range(60)]
        for ids in cases:
            whole = tok.decode(ids)
            ones = [1] * len(ids)
            mixed = [rng.randrange(1, 5) for _ in range(len(ids))]
            for chunks in (ones, mixed):
                deltas, tail = _streamed(tok, ids, chunks)
                assert "".join(deltas) + tail == whole, (tok.folder, ids, chunks)
                assert not any(d.endswith(REPLACEMENT) for d in deltas), (tok.folder, ids)


def test_a_push_decodes_a_window_not_the_whole_output(tokenizer_dir: Path) -> None:
    """What each push hands the decoder stays short however long the answer
    gets (the cost per token no longer grows with the output)."""
    tok = Tokenizer(tokenizer_dir)
    seen: list[int] = []

    def decode(ids: list[int]) -> str:
        seen.append(len(ids))
        return tok.decode(ids)

    ids = tok.encode(("the quick brown fox, " * 80) + TEXT)
    stream = IncrementalText(decode)
    text = "".join(stream.push([t]) for t in ids)
    assert len(ids) > 300
    assert max(seen) <= 8, max(seen)  # a character spans at most a few byte tokens
    seen.clear()
    assert text + stream.flush() == tok.decode(ids)
    assert seen == [len(ids)]  # flush: one whole decode
