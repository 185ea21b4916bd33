"""Fuzz ``trtspec validate`` with generated bad specs and count how each ends.

Each case starts from one of the example specs in ``build_specs/`` (copied
with its prompt files into a scratch folder) and applies one seeded mutation:
a scalar replaced by a hostile value (NUL and other control characters, a
100 kB string or path, a boolean where a number belongs, a negative, huge or
non-finite number, a list or mapping, null, lone surrogates), a key removed,
renamed or added, the text cut short, a byte flipped, or invalid UTF-8
spliced in. The spec is written to disk and validated through the real CLI
(Click's ``CliRunner``, the same error boundary a user meets), so every case
ends in exactly one way:

- ``valid``: exit 0 (the mutation happened to be legal);
- ``clear``: exit 1 with ``Error: …`` naming the problem;
- ``unexpected``: the boundary's ``Error: unexpected <Exception>`` (a bug);
- ``traceback``: a Python traceback reached the output (a bug);
- ``other``: any other exit code or output shape (a bug).

It prints the counts and each unexpected/traceback/other case (seed,
mutation, first lines of output), as JSON with ``--json``. Exit 1 when any
case is a bug. Bounded: ``--cases`` specs (default 1,200) and
``--max-seconds`` in all. Not part of ``make test`` (it takes about a
minute on two cores).

Run: ``.venv/bin/python benchmarks/fuzz_specs.py [--cases 1200] [--seed 0]``
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from trtspec.cli.main import cli

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "build_specs").glob("*.yaml"))

HOSTILE: list[Any] = [
    "a\x00b",
    "\x00",
    "x\x01\x02\x1b[31m",
    "line\nbreak",
    "tab\there",
    "\x7f",
    "/" + "a" * 100_000,
    "./" + "b/" * 20_000,
    "a" * 100_000,
    "",
    " ",
    "\u202e\u200b",
    "../../../../etc/passwd",
    "/dev/null",
    "/proc/self/mem",
    "~nobody/x",
    True,
    False,
    None,
    -1,
    0,
    2**63,
    -(2**63),
    10**400,
    1e308,
    float("inf"),
    float("-inf"),
    float("nan"),
    0.5,
    "1",
    "true",
    [],
    [None],
    {},
    {"a": 1},
    [[1, 2], [3]],
]


def scalars(data: Any, path: tuple = ()) -> list[tuple]:
    """Paths of every value in ``data`` (scalars and containers)."""
    out = [path]
    if isinstance(data, dict):
        for key, value in data.items():
            out += scalars(value, (*path, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            out += scalars(value, (*path, i))
    return out


def put(data: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    node = data
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return data


def drop(data: Any, path: tuple) -> Any:
    node = data
    for part in path[:-1]:
        node = node[part]
    if isinstance(node, dict):
        node.pop(path[-1], None)
    elif isinstance(node, list) and node:
        node.pop(path[-1])
    return data


class _Dumper(yaml.SafeDumper):
    pass


def _dump(data: Any) -> str:
    # allow_unicode keeps control characters as YAML escapes where YAML needs them.
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=10**9)


def mutate(text: str, rng: random.Random) -> tuple[str | bytes, str]:
    """One mutation of a spec's text: (new text or bytes, what was done)."""
    data = yaml.safe_load(text)
    kind = rng.choice(
        ["value"] * 6 + ["drop", "rename", "add", "truncate", "flip", "bad_utf8", "raw_control"]
    )
    if kind in ("value", "drop", "rename", "add"):
        paths = [p for p in scalars(data) if p]
        path = rng.choice(paths)
        if kind == "value":
            value = rng.choice(HOSTILE)
            label = (
                repr(value)
                if not isinstance(value, str) or len(value) < 40
                else (f"str[{len(value)}]")
            )
            try:
                return _dump(put(data, path, value)), f"value {path} = {label}"
            except (ValueError, OverflowError):
                return text, "unchanged"
        if kind == "drop":
            return _dump(drop(data, path)), f"drop {path}"
        parent = path[:-1]
        node = data
        for part in parent:
            node = node[part]
        if isinstance(node, dict):
            key = path[-1]
            new = rng.choice([f"{key}x", str(key).upper(), f"{key}\x00", "", "a" * 5000, 7])
            if kind == "rename":
                node[new] = node.pop(key)
                return _dump(data), f"rename {path} -> {new!r:.40}"
            node[new] = rng.choice(HOSTILE[:20])
            return _dump(data), f"add {(*parent, new)!r:.60}"
        return _dump(drop(data, path)), f"drop {path}"
    raw = text.encode("utf-8")
    if kind == "truncate":
        cut = rng.randrange(len(raw))
        return raw[:cut], f"truncate at byte {cut}"
    if kind == "flip":
        at = rng.randrange(len(raw))
        return raw[:at] + bytes([rng.randrange(256)]) + raw[at + 1 :], f"flip byte {at}"
    if kind == "bad_utf8":
        at = rng.randrange(len(raw))
        junk = rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"])
        return raw[:at] + junk + raw[at:], f"invalid UTF-8 at byte {at}"
    at = rng.randrange(len(raw))
    junk = bytes([rng.choice([0, 1, 7, 8, 0x0B, 0x0C, 0x1B, 0x7F])])
    return raw[:at] + junk + raw[at:], f"control byte {junk!r} at byte {at}"


def classify(exit_code: int, output: str) -> str:
    if "Traceback (most recent call last)" in output:
        return "traceback"
    if exit_code == 0:
        return "valid"
    if "Error: unexpected" in output:
        return "unexpected"
    if (
        exit_code == 1
        and output.lstrip().startswith(("Error: ", "Warning: "))
        and "Error: " in (output)
    ):
        return "clear"
    return "other"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=1200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-seconds", type=float, default=600.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="trtspec-fuzz-"))
    shutil.copytree(ROOT / "build_specs", work / "build_specs")
    texts = {p.name: p.read_text(encoding="utf-8") for p in EXAMPLES}
    runner = CliRunner()
    counts: Counter[str] = Counter()
    bugs: list[dict[str, Any]] = []
    start = time.monotonic()
    try:
        for case in range(args.cases):
            if time.monotonic() - start > args.max_seconds:
                print(f"fuzz: stopped at the time bound after {case} cases", file=sys.stderr)
                break
            name = rng.choice(sorted(texts))
            content, what = mutate(texts[name], rng)
            path = work / "build_specs" / f"fuzz-{case}.yaml"
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content, encoding="utf-8", errors="surrogateescape")
            result = runner.invoke(cli, ["validate", str(path)], catch_exceptions=True)
            output = result.output
            if result.exception is not None and not isinstance(result.exception, SystemExit):
                output += f"\n[exception escaped the CLI: {result.exception!r}]"
                kind = "unexpected"
            else:
                kind = classify(result.exit_code, output)
            counts[kind] += 1
            if kind in ("unexpected", "traceback", "other"):
                bugs.append(
                    {
                        "case": case,
                        "spec": name,
                        "mutation": what,
                        "kind": kind,
                        "exit": result.exit_code,
                        "output": output[:600],
                    }
                )
            path.unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    elapsed = time.monotonic() - start
    report = {
        "cases": sum(counts.values()),
        "seed": args.seed,
        "seconds": round(elapsed, 1),
        "counts": dict(counts),
        "bugs": bugs,
    }
    for bug in bugs:
        print(f"[{bug['kind']}] case {bug['case']} {bug['spec']}: {bug['mutation']}")
        print("   " + bug["output"].strip().replace("\n", "\n   ")[:400])
    print(
        f"fuzz: {report['cases']} cases in {elapsed:.0f} s: "
        + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2), encoding="utf-8")
    return 1 if bugs else 0


if __name__ == "__main__":
    sys.exit(main())
