"""Each route's golden set for the production golden diff: its prompts with
a ``golden`` answer first, then the rest in file order,
``rollout.golden_prompts`` of them, rendered to the exact ``text_input`` a
client sends (chat prompts through the target's tokenizer, as the benchmark
renders them). ``trtspec repo`` passes it to ``assemble``, which writes it
into ``router/rollout.json``. A chat route with no tokenizer to render it
(engines not built yet) gets no golden set.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.errors import BenchError

if TYPE_CHECKING:
    from trtspec.spec.schema import Spec


def golden_set(spec: Spec, tokenizer_dir: Path | None) -> dict[str, list[str]]:
    from trtspec.bench.routes import load_prompt_set, load_tokenizer, render_prompt

    if spec.rollout.golden_every == 0:
        return {}
    tokenizer: Any = None
    loaded = False
    out: dict[str, list[str]] = {}
    for name, route in spec.routes.items():
        try:
            items = load_prompt_set(spec.resolve_path(route.prompts))
        except BenchError:
            continue  # `trtspec bench` reports a missing prompt set
        ordered = [it for it in items if it.get("golden") is not None] + [
            it for it in items if it.get("golden") is None
        ]
        chosen = ordered[: spec.rollout.golden_prompts]
        if any(it.get("prompt") is None for it in chosen) and not loaded:
            loaded = True
            if tokenizer_dir is not None and Path(tokenizer_dir).is_dir():
                tokenizer = load_tokenizer(Path(tokenizer_dir))
        if tokenizer is None:
            chosen = [it for it in chosen if it.get("prompt") is not None]
        texts = [render_prompt(it, tokenizer) for it in chosen]
        if texts:
            out[name] = texts
    return out
