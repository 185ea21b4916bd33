"""What streaming detokenization costs per token as an answer grows.

Every streamed token of every request passes through
``trtspec.runtime.text.IncrementalText`` in the serving path (the
orchestrator code the router runs in its own process, the LLM-API CPU
stand-in, the OpenAI-compatible reference server), on the router's one
Python thread. Until this round it decoded the whole output on every push
and returned the new part: a cost per token that grows with the answer.
This script measures, side by side in one run, that whole-output decode
(``before``, kept here as the reference) and the window decode
``IncrementalText`` does now (``after``), token by token through answers of
``--lengths`` tokens, and prints the mean and the last-64-tokens cost per
token in microseconds and their ratio, and whether both produced the same
text (they must). The tokenizer is the demo's SmolLM2 when ``make demo``
has fetched it, else the tests' tiny byte-level BPE.

Run: ``.venv/bin/python benchmarks/detokenize.py [--lengths 32,256,1024,2048]
[--repeats 3]``. At a GPU's 8,000 tokens/s through one router process, one
token may cost the whole path ~0.125 ms of that process's CPU: the figures
say how much of it detokenization takes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "toolkit"), str(ROOT)]

from trtspec.runtime.text import REPLACEMENT, IncrementalText, Tokenizer  # noqa: E402

SMOLLM2 = ROOT / ".cache" / "models" / "smollm2-135m-instruct"
# Mixed prose, code and non-ASCII text, so multi-byte characters span tokens.
SOURCE = (
    "Speculative decoding drafts tokens that the target verifies in one step. "
    "def accept(draft, target):\n    return [d for d, t in zip(draft, target) if d == t]\n"
    "Überprüfung — 検証 — vérification ✓ "
)


class WholeDecode:
    """The detokenizer before this round: decode everything, return the new part."""

    def __init__(self, decode: Any) -> None:
        self.decode = decode
        self.ids: list[int] = []
        self.sent = ""

    def push(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
        text = self.decode(self.ids)
        if text.endswith(REPLACEMENT):
            return ""
        delta = text[len(self.sent) :] if text.startswith(self.sent) else ""
        self.sent += delta
        return delta

    def flush(self) -> str:
        text = self.decode(self.ids)
        delta = text[len(self.sent) :]
        self.sent += delta
        return delta


def tokenizer() -> tuple[Tokenizer, str]:
    if (SMOLLM2 / "tokenizer.json").is_file():
        return Tokenizer(SMOLLM2), "SmolLM2-135M-Instruct"
    from tests.fixtures.tiny_model import train_tokenizer

    folder = Path(tempfile.mkdtemp(prefix="trtspec-detok-"))
    train_tokenizer(folder)
    return Tokenizer(folder), "the tests' tiny byte-level BPE"


def run(make: Any, tok: Tokenizer, ids: list[int]) -> tuple[list[float], str]:
    """Seconds per push, and the streamed text."""
    stream = make(tok.decode)
    costs, parts = [], []
    for token in ids:
        t0 = time.perf_counter()
        parts.append(stream.push([token]))
        costs.append(time.perf_counter() - t0)
    parts.append(stream.flush())
    return costs, "".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="32,256,1024,2048", help="answer lengths in tokens")
    p.add_argument("--repeats", type=int, default=3, help="runs per cell (the best is kept)")
    args = p.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    tok, name = tokenizer()
    ids = tok.encode(SOURCE * (max(lengths) // 20 + 2))
    print(f"tokenizer: {name}; one token per push; best of {args.repeats} runs (µs per token)")
    print(
        f"{'tokens':>7} {'before mean':>12} {'after mean':>11} {'x':>6}"
        f" {'before last64':>14} {'after last64':>13} {'x':>6}  same text"
    )
    all_same = True
    for n in lengths:
        answer = ids[:n]
        cells: dict[str, tuple[float, float]] = {}
        texts: dict[str, str] = {}
        for label, make in (("before", WholeDecode), ("after", IncrementalText)):
            best: tuple[float, float] | None = None
            for _ in range(args.repeats):
                costs, text = run(make, tok, answer)
                mean = statistics.fmean(costs) * 1e6
                last = statistics.fmean(costs[-64:]) * 1e6
                best = (mean, last) if best is None or mean < best[0] else best
                texts[label] = text
            assert best is not None
            cells[label] = best
        same = texts["before"] == texts["after"] == tok.decode(answer)
        all_same = all_same and same
        (bm, bl), (am, al) = cells["before"], cells["after"]
        print(
            f"{n:>7} {bm:>12.1f} {am:>11.1f} {bm / am:>6.1f} {bl:>14.1f} {al:>13.1f}"
            f" {bl / al:>6.1f}  {same}"
        )
    return 0 if all_same else 1


if __name__ == "__main__":
    sys.exit(main())
