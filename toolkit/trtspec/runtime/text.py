"""Tokenizer loading and incremental detokenization for the Python models.

Owns the two text concerns the served models share: loading the target
engine's ``tokenizer/`` folder with the light ``tokenizers`` library when a
``tokenizer.json`` is there (a stub that imports transformers pays seconds and
hundreds of MB; transformers is the fallback for folders without one), and
``IncrementalText``, which turns a growing list of token ids into text deltas
that never split a multi-byte character (text ending in U+FFFD is held back
until the next token completes it), and ``CumulativeText``, which turns the
whole-text-so-far responses of TensorRT-LLM's llmapi model back into deltas.
No Triton imports: unit-testable as is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPLACEMENT = "\ufffd"


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


class Tokenizer:
    """``encode(text) -> ids`` and ``decode(ids) -> text`` plus end/pad ids."""

    def __init__(
        self,
        folder: str | Path,
        *,
        add_special_tokens: bool = True,
        skip_special_tokens: bool = True,
    ) -> None:
        self.folder = Path(folder)
        self.add_special_tokens = add_special_tokens
        self.skip_special_tokens = skip_special_tokens
        config_path = self.folder / "tokenizer_config.json"
        config: dict[str, Any] = {}
        if config_path.is_file():
            config = json.loads(config_path.read_text(encoding="utf-8"))
        self._fast: Any = None
        self._hf: Any = None
        if (self.folder / "tokenizer.json").is_file():
            from tokenizers import Tokenizer as FastTokenizer

            self._fast = FastTokenizer.from_file(str(self.folder / "tokenizer.json"))
        else:
            from transformers import AutoTokenizer

            self._hf = AutoTokenizer.from_pretrained(str(self.folder))
        eos = _token_text(config.get("eos_token"))
        pad = _token_text(config.get("pad_token"))
        self.end_id = self._id_of(eos) if eos else self._hf_attr("eos_token_id")
        pad_id = self._id_of(pad) if pad else self._hf_attr("pad_token_id")
        self.pad_id = pad_id if pad_id is not None else self.end_id

    def _hf_attr(self, name: str) -> int | None:
        return getattr(self._hf, name, None) if self._hf is not None else None

    def _id_of(self, token: str) -> int | None:
        if self._fast is not None:
            return self._fast.token_to_id(token)
        return int(self._hf.convert_tokens_to_ids(token))

    def encode(self, text: str) -> list[int]:
        if self._fast is not None:
            return list(self._fast.encode(text, add_special_tokens=self.add_special_tokens).ids)
        return list(self._hf.encode(text, add_special_tokens=self.add_special_tokens))

    def decode(self, ids: list[int]) -> str:
        if self._fast is not None:
            return str(self._fast.decode(ids, skip_special_tokens=self.skip_special_tokens))
        return str(self._hf.decode(ids, skip_special_tokens=self.skip_special_tokens))


@dataclass
class IncrementalText:
    """Streaming detokenization. ``push(ids)`` returns the text that became
    final; ``flush()`` returns whatever is left.

    Each push decodes a short window, not the whole output: the ids from the
    start of the previous delta's tokens on (``_start``), once up to where
    that delta ended (``_read``) and once to the end, and returns the part
    the new ids added. A decode of everything so far on every token cost
    ~8 µs a token at 32 tokens and ~190 µs at the 1,000th on the demo's
    tokenizer (``benchmarks/detokenize.py``): at a GPU's token rates, the
    served path's largest Python cost on long answers. The window keeps one
    token of context before the new ones, so a decoder that strips the
    first token's leading space (SentencePiece's ``▁``) strips it from both
    decodes alike. Text ending in U+FFFD (an incomplete UTF-8 sequence) is
    held back, as is a push that added no text, and the window grows until
    the text is complete. ``flush`` decodes everything once and sends what
    the whole text holds beyond what was sent, so the answer's text is the
    full decode's wherever the deltas agreed with it (the tests check that
    for byte-level BPE and a SentencePiece-style tokenizer)."""

    decode: Any  # Callable[[list[int]], str]
    ids: list[int] = field(default_factory=list)
    _pieces: list[str] = field(default_factory=list, repr=False)
    _start: int = 0  # the window's first id
    _read: int = 0  # ids whose text went out
    _prefix: str | None = None  # decode(ids[_start:_read]), None = not yet decoded

    @property
    def sent(self) -> str:
        """The text returned so far."""
        return "".join(self._pieces)

    def push(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
        if self._prefix is None:
            self._prefix = self.decode(self.ids[self._start : self._read])
        text = self.decode(self.ids[self._start :])
        if text.endswith(REPLACEMENT) or len(text) <= len(self._prefix):
            # An incomplete UTF-8 sequence (wait for the bytes that finish
            # it), or nothing new yet (a skipped special token, say).
            return ""
        # A tokenizer whose earlier text changed with more context (rare):
        # what extends beyond the characters already sent, as a whole decode would.
        delta = text[len(self._prefix) :]
        self._pieces.append(delta)
        self._start, self._read, self._prefix = self._read, len(self.ids), None
        return delta

    def flush(self) -> str:
        text, sent = self.decode(self.ids), self.sent
        delta = text[len(sent) :] if len(text) > len(sent) else ""
        if delta:
            self._pieces = [sent, delta]
        self._start = self._read = len(self.ids)
        self._prefix = None
        return delta


@dataclass
class CumulativeText:
    """Deltas from a stream whose every response carries the whole text so
    far, as TensorRT-LLM's Triton ``llmapi`` model streams: its
    ``_create_response`` puts ``CompletionOutput.text`` into ``text_output``,
    and ``text`` is the cumulative text (``text_diff``, ``text[_last_text_len:]``,
    would be the delta): ``triton_backend/all_models/llmapi/tensorrt_llm/1/model.py``
    at b35ac1b6 (1.2.0rc2) and 044a90d2, ``tensorrt_llm/executor/result.py`` at
    005bc848. ``update(whole)`` returns what ``whole`` adds to the text seen so
    far: "" for a response that repeats it (an iteration that added no
    printable text, the final response). Where a later text does not extend
    the earlier one (a stop string trimmed at the end, say), what was already
    sent stays sent and only characters beyond it go out; ``whole`` is always
    the model's latest text (the answer, for counting tokens)."""

    whole: str = ""
    sent: int = 0  # characters passed on as deltas
    revised: bool = False  # a response did not extend the one before

    def update(self, whole: str) -> str:
        if not whole.startswith(self.whole):
            self.revised = True
        self.whole = whole
        if len(whole) <= self.sent:
            return ""
        delta = whole[self.sent :]
        self.sent = len(whole)
        return delta


class LocalText:
    """The preprocessing and postprocessing models' work done in the caller's
    own process: ``encode`` (special tokens added, as ``preprocessing`` does),
    ``decode`` (special tokens skipped, as ``postprocessing`` does) and the
    end/pad ids, from the same tokenizer folder with the same settings, so the
    ids and text are the ones the two models would answer. An orchestrator
    whose config names ``tokenizer_dir`` uses it instead of a BLS call per
    request and per streamed token (``of_params`` is None without it)."""

    def __init__(self, folder: str | Path) -> None:
        self.tokenizer = Tokenizer(folder, add_special_tokens=True, skip_special_tokens=True)
        self.end_id, self.pad_id = self.tokenizer.end_id, self.tokenizer.pad_id

    @classmethod
    def of_params(cls, params: dict[str, str]) -> LocalText | None:
        folder = (params.get("tokenizer_dir") or "").strip()
        return cls(folder) if folder else None

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)
