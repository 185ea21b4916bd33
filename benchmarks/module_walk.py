"""Which trtspec modules each command of one spec loads: the module walk.

Runs each stage of a built spec as its own ``trtspec`` process (validate,
build (cached), repo, serve, bench against that server, repo --routing,
rollout status, doctor, deploy k8s, compare) and records, per command, the
``trtspec`` modules its process had imported when it exited (a
``sitecustomize`` hook written into a temporary folder on ``PYTHONPATH``).
``--code`` names a checkout's ``toolkit`` parent, so two trees (before and
after a change) can be walked over the same spec and engines; the workdir is
copied, never changed. The Triton stubs are not counted (they leave through
``os._exit``); ``tests/unit/test_layering.py`` holds what they may reach.

The workdir: a folder with ``specs/tiny.yaml`` and its built ``engines/``,
e.g. what ``tests/e2e/test_pipeline.py`` leaves under pytest's basetemp:

    .venv/bin/python -m pytest -q -p no:xdist --basetemp=/tmp/walk \\
        tests/e2e/test_pipeline.py
    .venv/bin/python benchmarks/module_walk.py --workdir /tmp/walk/e2e0 \\
        --code . --out /tmp/walk-after.json

Traffic goes to the loopback server this script starts (``trtspec serve``
binds 127.0.0.1), a fixed count per route (the spec's).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HOOK = """\
import atexit, json, os, sys


def _dump():
    out = os.environ.get("TRTSPEC_WALK_DIR")
    mods = sorted(m for m in sys.modules if m == "trtspec" or m.startswith("trtspec."))
    if out and mods:
        with open(os.path.join(out, f"{os.getpid()}.json"), "w") as fh:
            json.dump(mods, fh)


atexit.register(_dump)
"""
SPEC = "specs/tiny.yaml"


class Walk:
    def __init__(self, code: Path, work: Path, scratch: Path) -> None:
        self.code, self.work, self.scratch = code, work, scratch
        (scratch / "hook").mkdir()
        (scratch / "hook" / "sitecustomize.py").write_text(HOOK, encoding="utf-8")

    def env(self, tag: str) -> dict[str, str]:
        dumps = self.scratch / "dumps" / tag
        dumps.mkdir(parents=True, exist_ok=True)
        path = f"{self.scratch / 'hook'}{os.pathsep}{self.code / 'toolkit'}"
        return {**os.environ, "PYTHONPATH": path, "TRTSPEC_WALK_DIR": str(dumps)}

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "trtspec.cli.main", *args]

    def run(self, tag: str, *args: str) -> None:
        proc = subprocess.run(
            self.argv(*args),
            cwd=self.work,
            env=self.env(tag),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        last = (proc.stderr.strip().splitlines() or [""])[-1]
        print(f"{tag}: exit {proc.returncode} {last[:120]}", file=sys.stderr, flush=True)

    def serve_and_bench(self) -> None:
        server = subprocess.Popen(
            self.argv(
                "serve", "triton_repo/tiny-e2e", "--http-port", "0", "--grpc-port", "0",
                "--metrics-port", "0", "--format", "json",
                "--log-file", str(self.work / "serve.log"),
            ),
            cwd=self.work,
            env=self.env("serve"),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )  # fmt: skip
        try:
            grpc = _endpoint(server, deadline=time.monotonic() + 240)
            self.run("bench", "bench", SPEC, "--endpoint", grpc, "--run-dir", "results/walk",
                     "--no-plots", "--fixed-count")  # fmt: skip
        finally:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()

    def modules(self) -> dict[str, list[str]]:
        out = {}
        for folder in sorted((self.scratch / "dumps").iterdir()):
            seen: set[str] = set()
            for dump in folder.glob("*.json"):
                seen.update(json.loads(dump.read_text(encoding="utf-8")))
            out[folder.name] = sorted(seen)
        return out


def _endpoint(server: subprocess.Popen[str], deadline: float) -> str:
    assert server.stdout is not None
    buf = ""
    while time.monotonic() < deadline:
        line = server.stdout.readline()
        if not line:
            if server.poll() is not None:
                raise SystemExit(f"trtspec serve exited {server.returncode}")
            time.sleep(0.1)
            continue
        buf += line
        try:
            found = json.loads(buf)
        except json.JSONDecodeError:
            continue
        return str(found.get("grpc") or found.get("grpc_url"))
    raise SystemExit("trtspec serve did not report its endpoints in time")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path, required=True, help="built spec folder (copied)")
    ap.add_argument("--code", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--out", type=Path, help="write {command: [modules]} here as JSON")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="trtspec-walk-") as tmp:
        scratch = Path(tmp)
        work = scratch / "work"
        shutil.copytree(args.workdir, work, symlinks=True,
                        ignore=shutil.ignore_patterns("triton_repo", "results"))  # fmt: skip
        walk = Walk(args.code.resolve(), work, scratch)
        walk.run("validate", "validate", SPEC)
        walk.run("build", "build", SPEC)
        walk.run("repo", "repo", SPEC)
        walk.serve_and_bench()
        walk.run("repo_routing", "repo", SPEC, "--routing", "results/walk/routing.yaml")
        walk.run("rollout_status", "rollout", "status", "triton_repo/tiny-e2e")
        walk.run("doctor", "doctor", SPEC)
        walk.run("deploy", "deploy", "k8s", SPEC, "--image", "trtspec:walk",
                 "--repo", "triton_repo/tiny-e2e", "--out", "k8s")  # fmt: skip
        walk.run("compare", "compare", "results/walk", "results/walk")
        modules = walk.modules()
    for tag, names in modules.items():
        print(f"{tag:15s} {len(names):4d} modules")
    print(f"{'union':15s} {len({n for names in modules.values() for n in names}):4d} modules")
    if args.out:
        args.out.write_text(json.dumps(modules, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
