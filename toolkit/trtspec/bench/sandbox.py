"""Running a prompt's pytest tests against generated code, which is untrusted
input (model output). ``run_pytest`` stages the code (as module ``solution``)
and the tests (as ``test_solution.py``) in a fresh temp folder and starts
``python -m trtspec.bench.sandbox FOLDER …``: never in the bench's own process.
That launcher builds the sandbox (``trtspec.bench.jail``) and execs
``python -m pytest -q`` inside it; if any layer cannot be built it prints why
and exits without running the code, and the outcome is ``unavailable`` (the
check did not run), never a pass. There is no weaker mode.

The parent's part, here: the staging folder, the whole-tree limits (a pids
and a memory cgroup per check, v1 or v2, nested under the bench's own cgroup;
where the bench may not create them the launcher falls back to rlimits — see
``jail``), the wall-clock timeout (the launcher's process group and every
process in the cgroups are killed), and reading pytest's output. What the
sandbox promises is in ``docs/design/security.md``."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from trtspec.bench import jail
from trtspec.bench.jail import (
    ADDRESS_SPACE_LIMIT_BYTES,
    CODE_MODULE,
    FILE_SIZE_LIMIT_BYTES,
    PROCESS_LIMIT,
    TEST_FILE,
    TREE_MEMORY_LIMIT_BYTES,
    WORK_DIR,
    WORK_DIR_LIMIT_BYTES,
    child_env,
)

__all__ = [
    "ADDRESS_SPACE_LIMIT_BYTES",
    "CODE_MODULE",
    "FILE_SIZE_LIMIT_BYTES",
    "PROCESS_LIMIT",
    "TEST_FILE",
    "TREE_MEMORY_LIMIT_BYTES",
    "WORK_DIR",
    "WORK_DIR_LIMIT_BYTES",
    "PytestOutcome",
    "TreeLimits",
    "child_env",
    "run_pytest",
]

# The wall clock is generous (a loaded machine starts pytest slowly); the CPU
# limit is what stops a busy loop, whatever the load.
DEFAULT_TIMEOUT_S = 120.0
DEFAULT_CPU_S = 10
NAMESPACES, REFUSED = "namespaces", "refused"
CGROUP_V1, CGROUP_V2, RLIMITS = "cgroup v1", "cgroup v2", "rlimits"
UNAVAILABLE = "unavailable"
_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+?)(?: - .*)?$", re.M)
_SUMMARY = re.compile(r"^=*\s*(.*\b(?:passed|failed|error|errors|no tests ran)\b.*?)\s*=*$", re.M)


@dataclass
class PytestOutcome:
    status: str  # pass | fail | timeout | unavailable (the sandbox could not be built)
    failed_tests: list[str] = field(default_factory=list)
    summary: str = ""
    containment: str = REFUSED  # NAMESPACES when the code ran inside the sandbox
    tree_limits: str = ""  # CGROUP_V1 | CGROUP_V2 | RLIMITS: what bounded the process tree


def run_pytest(
    code: str, tests: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, cpu_s: int = DEFAULT_CPU_S
) -> PytestOutcome:
    """Run ``tests`` against ``code`` in the sandbox; see the module doc.
    ``timeout_s`` bounds wall-clock time, ``cpu_s`` the CPU seconds each
    process may use."""
    folder = Path(tempfile.mkdtemp(prefix="trtspec-pytest-"))
    limits = TreeLimits.create(folder.name)
    try:
        (folder / f"{CODE_MODULE}.py").write_text(code, encoding="utf-8")
        (folder / TEST_FILE).write_text(tests, encoding="utf-8")
        argv = [sys.executable, "-m", "trtspec.bench.sandbox", str(folder), str(max(1, cpu_s))]
        env = {**child_env(Path(WORK_DIR)), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        proc = subprocess.Popen(
            [*argv, *limits.dirs],
            cwd="/",
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            text=True,
            errors="replace",
        )
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill(proc, limits)
            out, _ = proc.communicate()
            outcome = _outcome(proc.returncode, out, limits)
            if outcome.status == UNAVAILABLE:
                return outcome
            outcome.status, outcome.summary = "timeout", f"timed out after {timeout_s:g}s"
            return outcome
        finally:
            _kill(proc, limits)
        return _outcome(proc.returncode, out, limits)
    finally:
        limits.close()
        shutil.rmtree(folder, ignore_errors=True)


def _kill(proc: subprocess.Popen[str], limits: TreeLimits) -> None:
    with contextlib.suppress(ProcessLookupError):  # the launcher and its group
        os.killpg(proc.pid, signal.SIGKILL)
    limits.kill_all()  # everything else in the tree, whatever its session


def _outcome(code: int | None, out: str, limits: TreeLimits) -> PytestOutcome:
    first, _, rest = out.partition("\n")
    tree = limits.kind or RLIMITS
    if not first.startswith(jail.MARK_CONTAINED):
        # the first line is the launcher's; code under test only writes after it
        if first.startswith(jail.MARK_REFUSED):
            why = first.removeprefix(jail.MARK_REFUSED).strip()
        else:  # the launcher itself failed (a traceback): its last line says why
            last = (out.strip().splitlines() or [""])[-1].strip()
            why = f"the launcher exited with {code}" + (f": {last}" if last else "")
        return PytestOutcome(UNAVAILABLE, [], f"sandbox unavailable: {why}"[:300], REFUSED, tree)
    failed = list(dict.fromkeys(_FAILED.findall(rest)))
    lines = _SUMMARY.findall(rest)
    summary = lines[-1].strip("= ") if lines else (rest.strip().splitlines() or [""])[-1][:200]
    if code == -signal.SIGKILL and limits.memory_kills():
        mib = TREE_MEMORY_LIMIT_BYTES // 2**20
        return PytestOutcome("fail", failed, f"memory limit hit ({mib} MiB)", NAMESPACES, tree)
    if code in (-signal.SIGXCPU, -signal.SIGKILL):
        # the first process of a PID namespace ignores SIGXCPU; the hard limit's
        # SIGKILL follows a second later
        return PytestOutcome("timeout", failed, "CPU time limit hit", NAMESPACES, tree)
    status = "pass" if code == 0 else "fail"
    return PytestOutcome(status, failed, summary, NAMESPACES, tree)


# -- whole-tree limits (cgroups) ---------------------------------------------------------


class TreeLimits:
    """A pids and a memory cgroup for one check, created under the bench's
    own cgroups (so nothing leaves the limits the bench itself runs under).
    ``dirs`` is empty (``kind`` None) where they cannot be created (not root,
    cgroup v2 without the controllers delegated to us, no cgroupfs): the
    launcher then bounds the tree with rlimits instead."""

    def __init__(self, dirs: list[str], kind: str | None) -> None:
        self.dirs, self.kind = dirs, kind

    @classmethod
    def create(cls, name: str) -> TreeLimits:
        if not sys.platform.startswith("linux") or os.geteuid() != 0:
            return cls([], None)
        leaf = f"{name}-{secrets.token_hex(3)}"
        for kind, finder in ((CGROUP_V2, _v2_parent), (CGROUP_V1, _v1_parents)):
            made: list[str] = []
            try:
                parents = finder()
                if not parents:
                    continue
                for parent in parents:
                    os.mkdir(os.path.join(parent, leaf), 0o700)
                    made.append(os.path.join(parent, leaf))
                for path in made:
                    _write_limits(path, kind)
                return cls(made, kind)
            except OSError:
                cls(made, kind).close()
        return cls([], None)

    def kill_all(self) -> None:
        for path in self.dirs:
            for _ in range(200):
                pids = _read_pids(path)
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.005)

    def memory_kills(self) -> int:
        """How many processes the memory cgroup's OOM killer ended."""
        for path in self.dirs:
            for name in ("memory.events", "memory.oom_control"):
                with contextlib.suppress(OSError):
                    text = Path(path, name).read_text()
                    found = re.search(r"^oom_kill (\d+)$", text, re.M)
                    if found:
                        return int(found[1])
        return 0

    def close(self) -> None:
        self.kill_all()
        for path in self.dirs:
            for _ in range(400):  # the last exits may still be under way
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.005)
        self.dirs = []


def _read_pids(path: str) -> list[int]:
    try:
        return [int(p) for p in Path(path, "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _write_limits(path: str, kind: str) -> None:
    files = {
        "pids.max": str(PROCESS_LIMIT),
        "memory.max": str(TREE_MEMORY_LIMIT_BYTES),  # v2
        "memory.swap.max": "0",
        "memory.limit_in_bytes": str(TREE_MEMORY_LIMIT_BYTES),  # v1
        "memory.memsw.limit_in_bytes": str(TREE_MEMORY_LIMIT_BYTES),
    }
    wrote = 0
    for name, value in files.items():
        target = Path(path, name)
        if not target.exists():
            continue
        try:
            target.write_text(value)
            wrote += 1
        except OSError:
            if name not in ("memory.swap.max", "memory.memsw.limit_in_bytes"):
                raise  # swap limits are extra: no swap accounting is not an error
    needed = ("pids.max", "memory.max") if kind == CGROUP_V2 else ("pids.max",)
    if kind == CGROUP_V2 and not all(Path(path, n).exists() for n in needed):
        raise OSError(f"{path}: the pids and memory controllers are not delegated")
    if not wrote:
        raise OSError(f"{path}: no limit could be written")


def _cgroup_mounts() -> list[tuple[str, str, str, str]]:
    """(fstype, mount root, mount point, super options) of each cgroupfs."""
    mounts = []
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            fields, extra = left.split(), right.split()
            if len(extra) >= 3 and extra[0] in ("cgroup", "cgroup2"):
                mounts.append((extra[0], fields[3], fields[4], extra[2]))
    return mounts


def _own_cgroups() -> dict[str, str]:
    """controller ("" for the v2 hierarchy) -> our cgroup path."""
    own = {}
    with open("/proc/self/cgroup", encoding="utf-8") as fh:
        for line in fh:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                own[name] = path
    return own


def _join(point: str, root: str, path: str) -> str:
    rel = path[len(root) :] if root != "/" and path.startswith(root) else path
    return os.path.join(point, rel.lstrip("/"))


def _v1_parents() -> list[str]:
    own, found = _own_cgroups(), {}
    for fstype, root, point, opts in _cgroup_mounts():
        for controller in ("pids", "memory"):
            if fstype == "cgroup" and controller in opts.split(",") and controller in own:
                found[controller] = _join(point, root, own[controller])
    return [found["pids"], found["memory"]] if len(found) == 2 else []


def _v2_parent() -> list[str]:
    own = _own_cgroups()
    for fstype, root, point, _ in _cgroup_mounts():
        if fstype == "cgroup2" and "" in own:
            parent = _join(point, root, own[""])
            with contextlib.suppress(OSError):
                enabled = Path(parent, "cgroup.subtree_control").read_text().split()
                if {"pids", "memory"} <= set(enabled):
                    return [parent]
    return []


if __name__ == "__main__":  # pragma: no cover - the launcher, in its own process
    jail.main(sys.argv[1:])
