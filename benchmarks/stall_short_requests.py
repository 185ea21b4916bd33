"""How often tritonserver 2.51 stalls under a high rate of short requests
through the router (docs/design/triton-limits.md: a lock-order deadlock in the
Python-backend stub, which freezes the router's stub for good).

With ``--watchdog`` each server runs under the stub watchdog: a frozen
router is killed after 10 s without a heartbeat and the server restarted,
so a trial that froze finishes (its line then names the incident) instead
of stalling. Measured in the fifth round, 8 trials each: 4 and 5 froze, 0
stalled.

Each trial runs ``benchmarks/ceiling.py`` once — the engine alone, then the
router as assembled, ``--levels`` clients in closed loop, ``--max-tokens``
tokens a request, ``--requests`` requests, 8 ms engine step — in a fresh
server, and counts it as stalled when it has not finished within
``--timeout`` seconds, or when it finished with failed requests and no
incident: ceiling.py gives up on a request after 60 s without a response
and ends its cell, so a frozen router now shows as a run that ends with
"N failed" and a few tokens a second (docs/design/triton-limits.md). With
``--watchdog`` a frozen router is an incident, and the trial counts as
recovered. The
settings (``--settings``) alternate trial by trial: ``on`` serves with the
router's metrics, ``off`` with ``TRTSPEC_ROUTER_METRICS=0``. It prints one
line per trial and the count per setting.

A stalled server does not stop by itself: after a trial times out, this
script kills every process whose command line names a ``trtspec-ceiling-``
folder, so do not run it beside another ``ceiling.py``. Loopback only.
Run: ``.venv/bin/python benchmarks/stall_short_requests.py [--trials 5]
[--settings on,off]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARK = "trtspec-ceiling-"


def kill_leftovers() -> None:
    """SIGKILL every process whose command line names a ceiling folder."""
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if MARK.encode() in cmdline:
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), signal.SIGKILL)


def trial(args: argparse.Namespace, setting: str) -> tuple[bool, float, str]:
    """(finished, seconds, the router's tokens/s line or '')."""
    env = dict(os.environ)
    env.pop("TRTSPEC_ROUTER_METRICS", None)
    if setting == "off":
        env["TRTSPEC_ROUTER_METRICS"] = "0"
    argv = [
        sys.executable,
        str(ROOT / "benchmarks" / "ceiling.py"),
        "--step-ms",
        "8",
        "--levels",
        str(args.level),
        "--layers",
        "engine,full",
        "--max-tokens",
        str(args.max_tokens),
        "--requests",
        str(args.requests),
        "--cell-seconds",
        "8",
        "--watchdog" if args.watchdog else "--no-watchdog",
    ]
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=args.timeout)
        finished = proc.returncode == 0
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        out, finished = "", False
    kill_leftovers()
    seconds = time.monotonic() - started
    finished, line = outcome(finished, out)
    return finished, seconds, line


def outcome(finished: bool, out: str) -> tuple[bool, str]:
    """(whether the trial ran through, its line) from ceiling.py's exit and
    output: a run that ended with failed requests and no incident froze
    (its requests waited out ceiling.py's response wait), and its line
    says how many failed."""
    lines = [ln.strip() for ln in out.splitlines()]
    line = next((ln for ln in lines if ln.startswith("full x")), "")
    incidents = [ln for ln in lines if ln.startswith("incident:")]
    failed = next((ln for ln in lines if re.match(r"\d+ failed, the first:", ln)), "")
    if incidents:
        return finished, f"{line}  [{len(incidents)} incident(s): {incidents[0]}]"
    if finished and failed:
        return False, f"{line}  [froze: {failed}]"
    return finished, line


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=5, help="trials per setting")
    p.add_argument("--settings", default="on,off", help="on (router metrics) and/or off")
    p.add_argument("--level", type=int, default=16, help="clients in flight")
    p.add_argument("--max-tokens", type=int, default=4, help="tokens a request")
    p.add_argument("--requests", type=int, default=800, help="requests a cell")
    p.add_argument("--timeout", type=float, default=100.0, help="seconds before a trial stalled")
    p.add_argument(
        "--watchdog",
        action="store_true",
        help="serve under the stub watchdog (a frozen router is killed and the server "
        "restarted): trials should then finish, with the incidents printed",
    )
    args = p.parse_args(argv)
    settings = [s for s in args.settings.split(",") if s]
    if not settings or any(s not in ("on", "off") for s in settings):
        print(f"error: --settings {args.settings!r}: use on, off or on,off", file=sys.stderr)
        return 2
    stalled = dict.fromkeys(settings, 0)
    for i in range(1, args.trials + 1):
        for setting in settings:
            finished, seconds, line = trial(args, setting)
            stalled[setting] += not finished
            result = line if finished else f"STALLED {line}".rstrip()
            print(f"trial {i} metrics {setting}: {seconds:.0f} s  {result}", flush=True)
    for setting in settings:
        print(f"metrics {setting}: {stalled[setting]} of {args.trials} trials stalled")
    return 0


if __name__ == "__main__":
    sys.exit(main())
