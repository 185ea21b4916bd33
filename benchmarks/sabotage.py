"""Plant known bugs in product code one at a time and say which tests catch each.

A round of "tests that bite" (issue 47) planted small, plausible bugs in
trtspec and ran the suite against each; this script makes such a round
repeatable. Each entry of ``SABOTAGES`` is a textual patch (an exact piece
of a product file under ``toolkit/`` and what replaces it; never a test)
and the fast tests meant to catch it. For each entry the script:

1. checks the piece occurs exactly once (else the entry no longer applies:
   the code moved or changed, and the entry must follow it);
2. keeps the original bytes in ``.sabotage/`` (a run killed outright is
   undone by the next run, before it plants anything), writes the patched
   file and moves its mtime on, so no stale ``__pycache__`` entry is used;
3. runs the entry's tests in a fresh ``pytest`` (``-p no:xdist``, and
   ``-m "not slow and not e2e"`` unless ``--all-tests``), reading which
   failed from its JUnit XML;
4. restores the file byte for byte with its old mtime, in a ``finally`` with
   SIGINT/SIGTERM held off, so Ctrl-C or a kill restores it too.

First it runs every named test once on the clean tree: a test that fails
there catches nothing and is reported apart. It prints, per bug, the tests
that failed with it planted (``caught by``) or ``NOT CAUGHT``, and exits 1
if any bug went uncaught or no longer applies, else 0. It changes files in
this checkout while it runs: run nothing else from the same checkout then.

Run: ``.venv/bin/python benchmarks/sabotage.py [--only NAME ...] [--list]
[--all-tests] [--json]``. About two minutes on two cores for every entry.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = "toolkit"  # the only tree a sabotage may touch
BACKUP_DIR = ".sabotage"


@dataclass(frozen=True)
class Sabotage:
    """One planted bug: replace ``old`` (exactly once in ``path``) by ``new``."""

    name: str
    path: str  # relative to the checkout, under toolkit/
    old: str
    new: str
    tests: tuple[str, ...]  # pytest node ids or files, relative to the checkout
    why: str


DECIDE_TESTS = (
    "tests/unit/test_decide_thresholds.py",
    "tests/unit/test_bench_summary.py",
    "tests/unit/test_decide_concurrency.py",
)

LLMAPI_TESTS = (
    "tests/unit/test_llmapi_stand_in_stream.py",
    "tests/unit/test_inprocess_variants.py",
    "tests/unit/test_instant_engine.py",
    "tests/unit/test_llmapi_flow.py",
)

HOSTILE_TESTS = ("tests/unit/test_rollout_hostile.py",)

DOWN_TESTS = (
    "tests/unit/test_callee_down.py",
    "tests/unit/test_router_fallback_slot.py",
    "tests/unit/test_inprocess_variants.py",
)

SABOTAGES: tuple[Sabotage, ...] = (
    Sabotage(
        name="summary-pairs-by-position",
        path="toolkit/trtspec/bench/summary.py",
        old=(
            "    pairs = [\n"
            '        (by_sample[r.get("sample_index")], r) for r in rows if r.get("sample_index")'
            " in by_sample\n"
            "    ]\n"
        ),
        new="    pairs = list(zip(baseline_rows, rows))  # noqa: B905\n",
        tests=("tests/unit/test_bench_pairing.py", "tests/unit/test_bench_summary.py"),
        why="the bench pairs baseline and variant rows by position, not by prompt sample",
    ),
    Sabotage(
        name="decide-on-the-point-estimate",
        path="toolkit/trtspec/bench/decide.py",
        old='    if sp["ci_low"] <= d["min_speedup"]:\n',
        new='    if sp["point"] <= d["min_speedup"]:\n',
        tests=DECIDE_TESTS,
        why="a variant is promoted on its point estimate while its interval straddles min_speedup",
    ),
    # the decision's other thresholds, each moved by one comparison
    *(
        Sabotage(
            name=f"decide-{name}-inclusive",
            path="toolkit/trtspec/bench/decide.py",
            old=old,
            new=new,
            tests=DECIDE_TESTS,
            why=f"the {what} threshold judges a value on its bound the wrong way",
        )
        for name, what, old, new in (
            (
                "slower",
                "slower-than-baseline (interval wholly below 1)",
                '    if sp["ci_high"] < 1.0:\n',
                '    if sp["ci_high"] <= 1.0:\n',
            ),
            (
                "p95",
                "p95 regression",
                'slower than baseline, speedup {ci}"], bool(broken)\n'
                "    if broken:\n"
                "        return EXCLUDE, broken, True\n"
                "    reasons = list(unsure)\n"
                '    reg = cell.get("p95_latency_regression")\n'
                '    if reg is not None and reg > d["max_p95_regression"]:\n',
                'slower than baseline, speedup {ci}"], bool(broken)\n'
                "    if broken:\n"
                "        return EXCLUDE, broken, True\n"
                "    reasons = list(unsure)\n"
                '    reg = cell.get("p95_latency_regression")\n'
                '    if reg is not None and reg >= d["max_p95_regression"]:\n',
            ),
            (
                "quality",
                "quality pass rate",
                "    elif (\n"
                "        qpr is not None\n"
                '        and qpr < d["min_quality_pass_rate"]\n',
                "    elif (\n"
                "        qpr is not None\n"
                '        and qpr <= d["min_quality_pass_rate"]\n',
            ),
            (
                "equality",
                "T=0 equality rate",
                'eq is not None and eq < d["min_equal_rate"]:\n',
                'eq is not None and eq <= d["min_equal_rate"]:\n',
            ),
            (
                "error-rate",
                "error rate",
                '        and error_rate > d["max_error_rate"]\n'
                "        and own_rate is not None\n"
                '        and own_rate > d["max_error_rate"]\n',
                '        and error_rate >= d["max_error_rate"]\n'
                "        and own_rate is not None\n"
                '        and own_rate >= d["max_error_rate"]\n',
            ),
        )
    ),
    Sabotage(
        name="canary-bucket-inclusive",
        path="toolkit/trtspec/artifacts/routing.py",
        old="    if canary_bucket(request_id) < round(rule.canary_percent * 100):\n",
        new="    if canary_bucket(request_id) <= round(rule.canary_percent * 100):\n",
        tests=("tests/unit/test_canary_boundary.py", "tests/unit/test_repo_routing.py"),
        why="the canary bucket is compared with <= (5% becomes 5.01%, 0% sends some traffic)",
    ),
    Sabotage(
        name="greedy-verify-by-the-drafts-argmax",
        path="toolkit/trtspec/runtime/engine/sampling.py",
        old=(
            "        if self.params.greedy:\n"
            "            pick = int(torch.argmax(target_logits).item())\n"
        ),
        new=(
            "        if self.params.greedy:\n"
            "            pick = int(torch.argmax(draft_logits).item())\n"
        ),
        tests=(
            "tests/unit/test_engine_decode.py::test_accept_by_logits_at_temperature_zero_is_matching",
            "tests/unit/test_engine_decode.py::"
            "test_accept_by_logits_at_temperature_zero_rejects_where_the_draft_disagrees",
            "tests/unit/test_engine_decode.py::"
            "test_a_disagreeing_draft_with_its_own_logits_is_rejected_at_temperature_zero",
        ),
        why="at T=0 a draft token verified by draft logits is checked against the draft's "
        "own argmax, not the target's",
    ),
    Sabotage(
        name="quality-gate-against-itself",
        path="toolkit/trtspec/bench/summary.py",
        old='(quality_passed(r.get("quality")) for r in base_ok) if q is not None\n',
        new='(quality_passed(r.get("quality")) for r in ok) if q is not None\n',
        tests=(
            "tests/unit/test_bench_pairing.py",
            "tests/unit/test_bench_summary.py",
            "tests/unit/test_quality_labels.py",
        ),
        why="the quality gate compares the variant's pass rate with its own, not the "
        "baseline arm's",
    ),
    Sabotage(
        name="llmapi-adapter-appends-whole-texts",
        path="toolkit/trtspec/runtime/models/llmapi_adapter.py",
        old="                piece = text.update(value)  # the whole text so far -> what it adds\n",
        new="                piece = value\n",
        tests=LLMAPI_TESTS,
        why="the LLM-API adapter relays each whole text so far as if it were a delta (a+ab+abc)",
    ),
    Sabotage(
        name="llmapi-stand-in-streams-deltas",
        path="toolkit/trtspec/runtime/engine/llmapi_model.py",
        old="            out.push(held)\n"
        "            held.clear()\n"
        "            if streaming:  # the whole text so far, changed or not "
        "(upstream's text_output)\n"
        '                finish = "None" if reason else None  # str(None) until it finishes\n'
        "                sender.send(self._response(out.sent, None,",
        new="            delta = out.push(held)\n"
        "            held.clear()\n"
        "            if streaming and delta:\n"
        '                finish = "None" if reason else None  # str(None) until it finishes\n'
        "                sender.send(self._response(delta, None,",
        tests=LLMAPI_TESTS,
        why="the CPU stand-in of the llmapi model streams deltas, where upstream's sends "
        "the whole text so far",
    ),
    # issue 44: a hostile rollout state, client-chosen labels, a dead stub, a full disk
    Sabotage(
        name="rollout-percent-unchecked",
        path="toolkit/trtspec/artifacts/rollout_state.py",
        old="    return float(value) if 0 <= value <= 100 else None\n",
        new="    return float(value)\n",
        tests=HOSTILE_TESTS,
        why="a rollout state's percent is taken as given (NaN, inf, 150, -50, a 400-digit one)",
    ),
    Sabotage(
        name="rollout-schema-unchecked",
        path="toolkit/trtspec/artifacts/rollout_state.py",
        old="    if isinstance(version, bool) or version != SCHEMA_VERSION:\n",
        new="    if False:\n",
        tests=HOSTILE_TESTS,
        why="a rollout state of another schema version is applied",
    ),
    Sabotage(
        name="rollout-link-elsewhere-followed",
        path="toolkit/trtspec/artifacts/rollout_state.py",
        old="    if os.path.commonpath([real, folder]) != folder:\n",
        new="    if False:\n",
        tests=HOSTILE_TESTS,
        why="a state.json that links out of the rollout folder is read",
    ),
    Sabotage(
        name="rollout-refusal-drops-the-last-good-state",
        path="toolkit/trtspec/artifacts/rollout_state.py",
        old="                if self._good:\n                    keep = ",
        new="                self._on_disk = None\n                self._apply()\n"
        "                if self._good:\n                    keep = ",
        tests=HOSTILE_TESTS,
        why="a refused state sends the router back to the routing table as written",
    ),
    Sabotage(
        name="rollout-change-writes-unchecked",
        path="toolkit/trtspec/artifacts/rollout_state.py",
        old='    after = validate_state(data, f"{STATE_FILE} (as it would be written)", digest)\n',
        new="    after = RolloutState(digest, {k: RouteState(v['percent'], v['status']) for k, v "
        "in data['routes'].items()}, revision + 1)\n",
        tests=HOSTILE_TESTS,
        why="advance/rollback write a percent the router would refuse (a ramp step of 150)",
    ),
    Sabotage(
        name="route-label-from-the-client",
        path="toolkit/trtspec/runtime/models/rollout_live.py",
        old="        known = not route or route in self.watcher.base.routes\n",
        new="        known = True\n",
        tests=("tests/unit/test_rollout_metrics.py",),
        why="a route the client made up becomes a label value (a series per made-up route)",
    ),
    Sabotage(
        name="metric-label-sets-unbounded",
        path="toolkit/trtspec/runtime/models/rollout_metrics.py",
        old="        if labels:\n            labels = self._bounded(name, labels)\n",
        new="",
        tests=("tests/unit/test_rollout_metrics.py",),
        why="a series takes any number of label sets",
    ),
    Sabotage(
        name="log-keeps-a-torn-write",
        path="toolkit/trtspec/runtime/models/rollout_log.py",
        old="            os.ftruncate(fd, start + keep)\n",
        new="            pass\n",
        tests=("tests/unit/test_rollout_log_disk.py",),
        why="a write the full disk refused part of leaves half a line in the request log",
    ),
    Sabotage(
        name="log-appends-after-a-torn-tail",
        path="toolkit/trtspec/runtime/models/rollout_log.py",
        old='    if not size or os.pread(fd, 1, size - 1) == b"\\n":\n',
        new="    if True:\n",
        tests=("tests/unit/test_rollout_log_disk.py",),
        why="the next line is glued to a torn tail a killed writer left",
    ),
    Sabotage(
        name="wait-ignores-a-dead-callee",
        path="toolkit/trtspec/runtime/threads.py",
        old="            if reason:\n                raise CalleeDown(reason) from None\n",
        new="",
        tests=DOWN_TESTS,
        why="a request waiting on a variant whose stub died waits out its deadline",
    ),
    Sabotage(
        name="router-relay-not-watching",
        path="toolkit/trtspec/runtime/models/router.py",
        old="            down=watch(variant),  # its stub died: ends now (CalleeDown), "
        "not at the deadline\n",
        new="",
        tests=DOWN_TESTS,
        why="the router's BLS relay does not see its variant go down",
    ),
    Sabotage(
        name="in-process-generation-not-watching",
        path="toolkit/trtspec/runtime/models/inprocess.py",
        old="            gen.down = watch(variant)  # an engine's stub died: ends now, "
        "not at the deadline\n",
        new="",
        tests=DOWN_TESTS,
        why="a generation in the router's process does not see its engine's stub die",
    ),
)


class SabotageError(Exception):
    """An entry that cannot be planted (no longer applies, or not product code)."""


@dataclass
class Result:
    sabotage: Sabotage
    caught_by: list[str] = field(default_factory=list)
    ran: int = 0
    error: str | None = None  # why it could not be planted


# ---- planting and restoring


def _backup_paths(root: Path, rel: str) -> tuple[Path, Path]:
    stem = rel.replace("/", "__")
    folder = root / BACKUP_DIR
    return folder / f"{stem}.orig", folder / f"{stem}.json"


def _check_target(root: Path, sab: Sabotage) -> Path:
    rel = Path(sab.path)
    if rel.is_absolute() or ".." in rel.parts or rel.parts[:1] != (PRODUCT,):
        raise SabotageError(
            f"{sab.path}: not product code under {PRODUCT}/; tests are never touched"
        )
    return root / rel


def recover(root: Path) -> list[str]:
    """Restore every file a killed run left planted; the paths restored."""
    folder = root / BACKUP_DIR
    restored = []
    for meta_path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        orig = meta_path.with_suffix(".orig")
        target = root / meta["path"]
        _write(target, orig.read_bytes(), meta["mtime_ns"])
        orig.unlink()
        meta_path.unlink()
        restored.append(meta["path"])
    return restored


def _write(path: Path, data: bytes, mtime_ns: int) -> None:
    tmp = path.with_name(f".{path.name}.sabotage-tmp")
    tmp.write_bytes(data)
    os.utime(tmp, ns=(mtime_ns, mtime_ns))
    os.replace(tmp, path)


_STAMPS: list[int] = []  # every mtime a plant has used, so none repeats


def _planted_mtime(orig_ns: int) -> int:
    """An mtime (whole seconds, as a .pyc records it) that neither the
    original nor any earlier plant had: a same-size patch still invalidates
    ``__pycache__``."""
    s = max(int(time.time()), orig_ns // 1_000_000_000 + 2, *(x + 1 for x in _STAMPS))
    _STAMPS.append(s)
    return s * 1_000_000_000


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    sigs = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextlib.contextmanager
def planted(root: Path, sab: Sabotage) -> Iterator[Path]:
    """``sab`` applied to its file for the ``with`` block, restored after it
    (on an exception or a signal too), byte for byte with its mtime."""
    target = _check_target(root, sab)
    data = target.read_bytes()
    text = data.decode("utf-8")
    count = text.count(sab.old)
    if count != 1:
        raise SabotageError(
            f"{sab.path}: the piece to replace occurs {count} times (needs exactly 1): "
            "the code changed; update this entry"
        )
    mtime_ns = target.stat().st_mtime_ns
    orig, meta = _backup_paths(root, sab.path)
    with _signals_held():
        orig.parent.mkdir(exist_ok=True)
        orig.write_bytes(data)
        meta.write_text(json.dumps({"path": sab.path, "mtime_ns": mtime_ns}), encoding="utf-8")
        _write(target, text.replace(sab.old, sab.new).encode("utf-8"), _planted_mtime(mtime_ns))
    try:
        yield target
    finally:
        with _signals_held():
            _write(target, data, mtime_ns)
            orig.unlink()
            meta.unlink()
        if target.read_bytes() != data:  # pragma: no cover - a disk that lies
            raise SabotageError(f"{sab.path}: not restored; recover it with git checkout")


# ---- running tests

Runner = Callable[[Path, Sequence[str]], tuple[int, list[str]]]


def run_pytest(
    root: Path, tests: Sequence[str], *, all_tests: bool = False
) -> tuple[int, list[str]]:
    """(tests run, node ids that failed or errored) of one fresh pytest."""
    with tempfile.TemporaryDirectory(prefix="sabotage-") as tmp:
        report = Path(tmp) / "junit.xml"
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider"]
        if not all_tests:
            argv += ["-m", "not slow and not e2e"]
        argv += [f"--junitxml={report}", *tests]
        subprocess.run(
            argv, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False
        )
        if not report.is_file():
            raise SabotageError(f"pytest wrote no report for {' '.join(tests)}")
        return _read_junit(report)


def _read_junit(report: Path) -> tuple[int, list[str]]:
    ran, failed = 0, []
    for case in ET.parse(report).getroot().iter("testcase"):
        if case.find("skipped") is not None:
            continue
        ran += 1
        if case.find("failure") is not None or case.find("error") is not None:
            module = (case.get("classname") or "").replace(".", "/")
            failed.append(f"{module}.py::{case.get('name')}")
    return ran, sorted(set(failed))


def run(
    root: Path, sabotages: Sequence[Sabotage], runner: Runner
) -> tuple[list[str], list[Result]]:
    """(tests failing on the clean tree, one result per sabotage)."""
    for path in recover(root):
        print(f"restored {path} (left planted by a killed run)", file=sys.stderr)
    every = list(dict.fromkeys(t for s in sabotages for t in s.tests))
    _, broken = runner(root, every)
    results = []
    for sab in sabotages:
        result = Result(sab)
        try:
            with planted(root, sab):
                result.ran, failed = runner(root, sab.tests)
        except SabotageError as exc:
            result.error = str(exc)
        else:
            result.caught_by = [t for t in failed if t not in broken]
        results.append(result)
    return broken, results


SHOWN = 8  # catching tests listed per bug in the text report


def render(broken: Sequence[str], results: Sequence[Result]) -> str:
    lines = []
    if broken:
        lines += ["failing on the clean tree (counted for no bug):", *(f"  {t}" for t in broken)]
    for r in results:
        head = f"{r.sabotage.name}: {r.sabotage.why}\n  {r.sabotage.path}"
        if r.error:
            lines.append(f"{head}\n  DOES NOT APPLY: {r.error}")
        elif r.caught_by:
            lines.append(f"{head}\n  caught by {len(r.caught_by)} of {r.ran} tests:")
            lines += [f"    {t}" for t in r.caught_by[:SHOWN]]
            if len(r.caught_by) > SHOWN:
                lines.append(f"    … and {len(r.caught_by) - SHOWN} more (--json lists all)")
        else:
            lines.append(f"{head}\n  NOT CAUGHT by any of {r.ran} tests")
    return "\n".join(lines)


def interrupt(signum: int, _frame: object) -> None:
    """SIGTERM as Ctrl-C: unwinds through ``planted``'s restore."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", default=[], help="run this entry (repeatable)")
    ap.add_argument("--list", action="store_true", help="list the entries and exit")
    ap.add_argument("--all-tests", action="store_true", help="slow and e2e tests count too")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args(argv)
    names = {s.name for s in SABOTAGES}
    unknown = sorted(set(args.only) - names)
    if unknown:
        ap.error(f"unknown entry {unknown[0]!r}; see --list")
    chosen = [s for s in SABOTAGES if not args.only or s.name in args.only]
    if args.list:
        for s in chosen:
            print(f"{s.name}\t{s.path}\t{s.why}")
        return 0

    def runner(root: Path, tests: Sequence[str]) -> tuple[int, list[str]]:
        return run_pytest(root, tests, all_tests=args.all_tests)

    signal.signal(signal.SIGTERM, interrupt)
    try:
        broken, results = run(ROOT, chosen, runner)
    except KeyboardInterrupt:
        print("interrupted: every planted file restored", file=sys.stderr)
        return 130
    if args.json:
        out = {
            "broken": broken,
            "results": [
                {
                    "name": r.sabotage.name,
                    "path": r.sabotage.path,
                    "ran": r.ran,
                    "caught_by": r.caught_by,
                    "error": r.error,
                }
                for r in results
            ],
        }
        print(json.dumps(out, indent=2))
    else:
        print(render(broken, results))
    return 0 if all(r.caught_by and not r.error for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
