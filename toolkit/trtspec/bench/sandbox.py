"""Running a prompt's pytest tests against generated code, which is untrusted
input. ``run_pytest`` writes the code (as module ``solution``) and the tests
(as ``test_solution.py``) into a fresh temp folder and starts
``python -m trtspec.bench.sandbox FOLDER`` — never in the bench's own
process, never with the repository as working directory. That child contains
itself, then execs ``python -m pytest -q`` in the folder:

* always: an environment built from scratch (no proxies, no credentials,
  ``HOME``/``TMPDIR`` inside the folder), and ``resource`` limits on CPU time,
  address space, file size, open files and core dumps; the parent kills the
  whole process group at the wall-clock timeout.
* where the process may create namespaces (root here; Linux): a private
  network namespace (no interface up, so no network at all), a private
  mount namespace in which every mount is remounted read-only except a bind
  mount of the check folder — so the code can write only there — and a
  private PID namespace (it cannot signal any process outside; when its
  first process ends, the kernel kills the rest). Then every capability is
  dropped (bounding set emptied, no_new_privs), so the code, although uid 0,
  cannot remount, mount, or undo any of it.

Without namespaces (not root, or a kernel/container that forbids them) the
limits still hold but the filesystem is only as protected as the user's own
permissions: code could write anywhere that user can. What namespaces do not
hide: files readable by the user stay readable (read-only is not invisible),
and the kernel itself is shared. The result says which containment applied."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

# The wall clock is generous (a loaded machine starts pytest slowly); the CPU
# limit is what stops a busy loop, whatever the load.
DEFAULT_TIMEOUT_S = 120.0
DEFAULT_CPU_S = 10
MEMORY_LIMIT_BYTES = 2 * 2**30
FILE_SIZE_LIMIT_BYTES = 16 * 2**20
OPEN_FILES_LIMIT = 256
CODE_MODULE = "solution"
TEST_FILE = "test_solution.py"
NAMESPACES, LIMITS_ONLY = "namespaces", "limits only"
_MARK = "trtspec-sandbox: "
_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+?)(?: - .*)?$", re.M)
_SUMMARY = re.compile(r"^=*\s*(.*\b(?:passed|failed|error|errors|no tests ran)\b.*?)\s*=*$", re.M)

# linux/sched.h and linux/mount.h
_CLONE_NEWNS, _CLONE_NEWNET, _CLONE_NEWPID = 0x00020000, 0x40000000, 0x20000000
_MS_RDONLY, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
_PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _CAP_LAST = 24, 38, 63
_CAPABILITY_VERSION_3 = 0x20080522


@dataclass
class PytestOutcome:
    status: str  # pass | fail | timeout
    failed_tests: list[str] = field(default_factory=list)
    summary: str = ""
    containment: str = LIMITS_ONLY


def child_env(folder: Path) -> dict[str, str]:
    """The child's whole environment: nothing inherited but a fixed PATH."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(folder),
        "TMPDIR": str(folder / "tmp"),
        "LANG": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
    }


def run_pytest(
    code: str, tests: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, cpu_s: int = DEFAULT_CPU_S
) -> PytestOutcome:
    """Run ``tests`` against ``code`` in a contained child; see the module doc.
    ``timeout_s`` bounds wall-clock time, ``cpu_s`` the CPU seconds it may use."""
    folder = Path(tempfile.mkdtemp(prefix="trtspec-pytest-"))
    try:
        (folder / "tmp").mkdir()
        (folder / f"{CODE_MODULE}.py").write_text(code, encoding="utf-8")
        (folder / TEST_FILE).write_text(tests, encoding="utf-8")
        # an empty ini pins pytest's rootdir and keeps any outer config out
        (folder / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
        argv = [sys.executable, "-m", "trtspec.bench.sandbox", str(folder), str(max(1, cpu_s))]
        env = {**child_env(folder), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        proc = subprocess.Popen(
            argv,
            cwd=folder,
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
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            return PytestOutcome(
                "timeout", summary=f"timed out after {timeout_s:g}s", containment=_containment(out)
            )
        finally:
            with contextlib.suppress(ProcessLookupError):  # stray grandchildren
                os.killpg(proc.pid, signal.SIGKILL)
        return _outcome(proc.returncode, out)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _containment(out: str) -> str:
    return NAMESPACES if f"{_MARK}{NAMESPACES}" in out else LIMITS_ONLY


def _outcome(code: int, out: str) -> PytestOutcome:
    failed = list(dict.fromkeys(_FAILED.findall(out)))
    lines = _SUMMARY.findall(out)
    summary = lines[-1].strip("= ") if lines else (out.strip().splitlines() or [""])[-1][:200]
    if code in (-signal.SIGXCPU, -signal.SIGKILL):
        # the first process of a PID namespace ignores SIGXCPU; the hard limit's
        # SIGKILL follows a second later
        return PytestOutcome("timeout", failed, "CPU time limit hit", _containment(out))
    return PytestOutcome("pass" if code == 0 else "fail", failed, summary, _containment(out))


# -- the child ----------------------------------------------------------------------------


def _limit(cpu_s: int) -> None:
    # CPU: SIGXCPU at the soft limit, SIGKILL a second later should it be caught
    for which, soft, hard in (
        (resource.RLIMIT_CPU, cpu_s, cpu_s + 1),
        (resource.RLIMIT_AS, MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES),
        (resource.RLIMIT_FSIZE, FILE_SIZE_LIMIT_BYTES, FILE_SIZE_LIMIT_BYTES),
        (resource.RLIMIT_NOFILE, OPEN_FILES_LIMIT, OPEN_FILES_LIMIT),
        (resource.RLIMIT_CORE, 0, 0),
    ):
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(which, (soft, hard))


def _mount_points() -> list[str]:
    points = []
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            raw = line.split()[4]
            points.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), raw))
    return points


def _isolate(folder: Path) -> str | None:
    """Network and filesystem namespaces; the reason when they are unavailable."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return "needs root on Linux"
    libc = ctypes.CDLL(None, use_errno=True)

    def call(rc: int, what: str) -> None:
        if rc != 0:
            raise OSError(ctypes.get_errno(), what)

    try:
        call(libc.unshare(_CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWPID), "unshare")
        call(libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "make / private")
        target = str(folder).encode()
        call(libc.mount(target, target, None, _MS_BIND, None), "bind the check folder")
        for point in _mount_points():
            if point == str(folder):
                continue
            flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY
            libc.mount(None, point.encode(), None, flags, None)  # best effort per mount
    except OSError as exc:
        return f"{exc.strerror or exc} ({exc.args[-1]})"
    return None


def _drop_privileges() -> None:
    """Inside the namespaces: a /proc of the new PID namespace, then no
    capabilities at all, now or after exec."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount(b"proc", b"/proc", b"proc", 0, None)  # best effort: hides outside processes
    for cap in range(_CAP_LAST + 1):
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable × 2 words: all zero
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def _exec_pytest(folder: Path, cpu_s: int) -> None:
    _limit(cpu_s)
    os.chdir(folder)
    os.execve(
        sys.executable,
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rfE",
            "-p",
            "no:cacheprovider",
            "-c",
            str(folder / "pytest.ini"),
            TEST_FILE,
        ],
        child_env(folder),
    )


def main(argv: list[str]) -> None:  # pragma: no cover - runs in the contained child
    folder, cpu_s = Path(argv[0]).resolve(), int(argv[1])
    why = _isolate(folder)
    print(f"{_MARK}{NAMESPACES}" if why is None else f"{_MARK}{LIMITS_ONLY}: {why}", flush=True)
    if why is not None:
        _exec_pytest(folder, cpu_s)
    # the new PID namespace holds our children, not us: fork its first process
    pid = os.fork()
    if pid == 0:
        try:
            _drop_privileges()
            _exec_pytest(folder, cpu_s)
        finally:
            os._exit(127)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code < 0:  # report the signal (SIGKILL at the hard CPU limit) as our own
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
