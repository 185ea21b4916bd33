"""Cross-field rules of the spec's ``bench.external`` section (OpenAI-compatible
arms): names that cannot collide with the Triton arms, and pairing — a
speculative external arm names another external arm as its ``baseline``,
and that arm must be a baseline itself (no chains), so every decision
compares one server's speculative run with its own target-only twin."""

from __future__ import annotations

import difflib
import re
from typing import TYPE_CHECKING, Any

from trtspec.catalogue import BASELINE
from trtspec.spec.schema import RESERVED_NAMES

if TYPE_CHECKING:
    from trtspec.spec.schema import Spec

URL = re.compile(r"^https?://[^\s/?#]+(/[^\s?#]*)?$")


def check_external(spec: Spec, variant_names: dict[str, int], issues: Any) -> None:
    """Add a located issue for every broken external arm (``issues`` is the
    ``_Issues`` collector of ``trtspec.spec.checks``)."""
    external = spec.bench.external
    for name, arm in external.items():
        base = ("bench", "external", name)
        if name in variant_names:
            issues.add(
                base,
                f"{name!r} is also a variant name; give the external arm its own "
                "name (rows and decisions are keyed by arm name)",
                key=True,
            )
        elif name in RESERVED_NAMES or name.startswith("target_"):
            issues.add(
                base, f"{name!r} is reserved for trtspec's own models; pick another name", key=True
            )
        for field in ("openai", "metrics"):
            value = getattr(arm, field)
            if value is not None and not URL.match(value):
                issues.add(
                    (*base, field),
                    f"{value!r} is not an http(s) URL; write it like http://127.0.0.1:8000",
                )
        pair = arm.baseline
        if pair is None:
            continue
        where = (*base, "baseline")
        if pair == name:
            issues.add(
                where,
                "an arm cannot be its own baseline; name its server's "
                "target-only twin, or remove `baseline` to make this a baseline",
            )
        elif pair not in external:
            others = [n for n in external if n != name]
            close = difflib.get_close_matches(pair, others, n=1)
            if pair == BASELINE or pair in variant_names:
                fix = (
                    "external arms pair with another external arm (their own server's "
                    "target-only twin); trtspec's Triton arms sit beside them in the same "
                    "report"
                )
            elif close:
                fix = f"did you mean {close[0]!r}?"
            else:
                fix = "add that arm under bench.external, or use one of: " + (
                    ", ".join(others) or "(no other external arm)"
                )
            issues.add(where, f"no external arm named {pair!r}; {fix}")
        elif external[pair].baseline is not None:
            issues.add(
                where,
                f"{pair!r} has a baseline of its own ({external[pair].baseline!r}); "
                "a baseline must be a target-only arm without `baseline`",
            )
