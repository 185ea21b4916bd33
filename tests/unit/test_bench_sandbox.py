"""The pytest quality check (trtspec.bench.sandbox, .jail + quality.check_pytest):
real `python -m pytest` children that pass, fail and time out; the escapes a
hostile pass tried on the old sandbox (sysctl and core_pattern writes, block
device, /dev/kmsg, host unix sockets, /dev/shm, /etc/shadow, fork and memory
bombs, disk fill, loopback network) each fail inside it, with a control
showing the same probe code succeeds outside where that is safe to run; a
machine that cannot build the sandbox refuses to run the code; a prompt's
`tests` may name a file.

Every address here is loopback; the probes touch only what the test creates
(plus reading kernel.domainname before and after)."""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trtspec.bench import jail, sandbox
from trtspec.bench.quality import CHECKS, default_checks
from trtspec.bench.routes import load_prompt_set
from trtspec.errors import BenchError

ROOT = Path(__file__).resolve().parents[2]
AS_ROOT = os.geteuid() == 0  # this machine runs the tests as root: host uid 65534, cgroups
TESTS = (
    "from solution import add\n\n"
    "def test_small():\n    assert add(1, 2) == 3\n\n"
    "def test_negative():\n    assert add(-1, -2) == -3\n"
)


def test_passing_code_passes() -> None:
    out = sandbox.run_pytest("def add(a, b):\n    return a + b\n", TESTS)
    assert (out.status, out.failed_tests) == ("pass", []), out.summary
    assert out.summary.startswith("2 passed")
    assert out.containment == sandbox.NAMESPACES
    if AS_ROOT:  # here: the v1 pids and memory hierarchies
        assert out.tree_limits in (sandbox.CGROUP_V1, sandbox.CGROUP_V2)


def test_failing_code_names_the_failing_tests() -> None:
    out = sandbox.run_pytest("def add(a, b):\n    return a + abs(b)\n", TESTS)
    assert out.status == "fail"
    assert out.failed_tests == ["test_solution.py::test_negative"]
    assert out.summary.startswith("1 failed, 1 passed")


def test_code_that_does_not_import_fails_as_a_collection_error() -> None:
    out = sandbox.run_pytest("def add(a, b)\n    return a + b\n", TESTS)
    assert out.status == "fail"
    assert out.failed_tests == ["test_solution.py"]


def _running_processes_named(comm: str) -> list[int]:
    """Live processes called ``comm`` (a killed one whose parent died is a
    zombie until the host's init reaps it: not running)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        name, state = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2]
        if name == comm and state not in "ZX":
            found.append(int(proc.name))
    return found


def test_an_endless_loop_times_out_and_leaves_no_process() -> None:
    # the looping code names itself, and starts a second looper in a session of
    # its own (out of the launcher's process group): both must be gone after
    name = secrets.token_hex(7)
    code = (
        "import ctypes, os\n"
        "def add(a, b):\n"
        f"    ctypes.CDLL(None).prctl(15, {name.encode()!r}, 0, 0, 0)\n"
        "    if os.fork() == 0:\n        os.setsid()\n"
        "    while True:\n        pass\n"
    )
    out = sandbox.run_pytest(code, TESTS, timeout_s=4)
    assert out.status == "timeout"
    assert out.summary == "timed out after 4s"
    deadline = time.monotonic() + 2  # a SIGKILLed process may still be in its exit path
    while _running_processes_named(name) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _running_processes_named(name) == []


def test_a_busy_loop_is_stopped_by_the_cpu_limit_not_the_clock() -> None:
    code = "def add(a, b):\n    while True:\n        pass\n"
    out = sandbox.run_pytest(code, TESTS, timeout_s=600, cpu_s=2)
    assert out.status == "timeout"
    assert out.summary == "CPU time limit hit"


def test_pytest_itself_past_the_memory_limit_fails_saying_so() -> None:
    code = "def add(a, b):\n    hold = b'x' * (900 * 2**20)\n    return a + b\n"
    out = sandbox.run_pytest(code, TESTS)
    if out.tree_limits == sandbox.RLIMITS:  # no cgroup: MemoryError at the address-space rlimit
        both = ["test_solution.py::test_small", "test_solution.py::test_negative"]
        assert (out.status, out.failed_tests) == ("fail", both), out.summary
    else:
        mib = jail.TREE_MEMORY_LIMIT_BYTES // 2**20
        assert (out.status, out.summary) == ("fail", f"memory limit hit ({mib} MiB)")


def test_the_environment_has_no_proxies_or_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    tests = (
        "import os\n\n"
        "def test_env():\n"
        "    assert not any('proxy' in k.lower() or 'SECRET' in k for k in os.environ)\n"
        f"    assert os.getcwd() == os.environ['HOME'] == {sandbox.WORK_DIR!r}\n"
    )
    out = sandbox.run_pytest("", tests)
    assert out.status == "pass", out.summary


# -- escape probes ---------------------------------------------------------------------
# One sandboxed run holds every probe (a run costs ~1-2 s of CPU); each parent
# test below asserts its own probe was contained, and what it can on the host.

PROBES = '''
import errno, os, socket, stat, subprocess, sys, time

def write_sysctl():
    with open("/proc/sys/kernel/domainname", "w") as fh:
        fh.write("escaped")

def open_core_pattern():
    open("/proc/sys/kernel/core_pattern", "w").close()

def block_devices(top="/dev"):
    found = []
    for root, dirs, files in os.walk(top):
        for name in dirs + files:
            if stat.S_ISBLK(os.lstat(os.path.join(root, name)).st_mode):
                found.append(os.path.join(root, name))
    return found

def make_block_device(path):
    os.mknod(path, 0o600 | stat.S_IFBLK, os.makedev(7, 0))

def write_kmsg():
    with open("/dev/kmsg", "w") as fh:
        fh.write("escaped\\n")

def connect_unix(path):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        s.connect(path)
        s.sendall(b"escaped")

def connect_tcp(port):
    socket.create_connection(("127.0.0.1", port), timeout=2).close()

def read_file(path):
    with open(path, "rb") as fh:
        return fh.read()

def fork_bomb(count):
    """How many of ``count`` sleeping children could be started."""
    pids = []
    try:
        for _ in range(count):
            pid = os.fork()
            if pid == 0:
                time.sleep(60)
                os._exit(0)
            pids.append(pid)
    except OSError:
        pass
    for pid in pids:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    return len(pids)

def memory_bomb(each=900 * 2**20, count=3):
    """Exit codes of ``count`` processes that each fill and hold ``each`` bytes."""
    hold = "import time; b = b'x' * %d; print('held', flush=True); time.sleep(2)" % each
    procs = [subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL) for _ in range(count)]
    return [(p.wait(), p.stdout.read()) for p in procs]

def fill_disk(folder, chunk=15 * 2**20):
    """Bytes written in chunk-sized files before the first error, and its errno."""
    written = 0
    for i in range(100):
        try:
            with open(os.path.join(folder, "fill%d" % i), "wb") as fh:
                fh.write(b"0" * chunk)
            written += chunk
        except OSError as exc:
            return written, exc.errno
    return written, 0
'''


class HostTargets:
    """What the probes aim at, created on the host by the test."""

    def __init__(self, tmp: Path) -> None:
        self.token = secrets.token_hex(8)
        self.unix_paths = [str(tmp / "host.sock")]
        for folder in ("/tmp", "/run"):
            if os.access(folder, os.W_OK):
                self.unix_paths.append(f"{folder}/trtspec-probe-{self.token}.sock")
        self.abstract = f"\0trtspec-probe-{self.token}"
        self.unix: list[socket.socket] = []
        for path in [*self.unix_paths, self.abstract]:
            srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            srv.bind(path)
            srv.listen(8)
            srv.setblocking(False)
            self.unix.append(srv)
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.tcp.setblocking(False)
        self.port = self.tcp.getsockname()[1]
        self.shm = Path(f"/dev/shm/trtspec-probe-{self.token}")
        self.shm.write_text(f"secret {self.token}")

    def accepted(self) -> int:
        """How many connections reached any listener (each is drained)."""
        count = 0
        for srv in [*self.unix, self.tcp]:
            while True:
                try:
                    conn, _ = srv.accept()
                except BlockingIOError:
                    break
                conn.close()
                count += 1
        return count

    def close(self) -> None:
        for srv in [*self.unix, self.tcp]:
            srv.close()
        for path in self.unix_paths:
            Path(path).unlink(missing_ok=True)
        self.shm.unlink(missing_ok=True)


PROBE_TESTS = {
    "sysctl": """
    with pytest.raises(OSError) as err:
        write_sysctl()
    assert err.value.errno == errno.EROFS
""",
    "core_pattern": """
    with pytest.raises(OSError) as err:
        open_core_pattern()
    assert err.value.errno == errno.EROFS
""",
    "block_device": """
    assert block_devices() == []
    with pytest.raises(PermissionError):
        make_block_device(os.path.join(os.getcwd(), "loop0"))
    with pytest.raises(OSError) as err:
        make_block_device("/dev/loop0")
    assert err.value.errno in (errno.EROFS, errno.EPERM)
""",
    "kmsg": """
    assert not os.path.exists("/dev/kmsg")
    with pytest.raises(OSError) as err:
        write_kmsg()
    assert err.value.errno == errno.EROFS  # /dev is read-only, and has no kmsg
    with pytest.raises(PermissionError):
        read_file("/proc/kmsg")
""",
    "unix_socket": """
    for path in T["unix_paths"]:
        with pytest.raises(FileNotFoundError):
            connect_unix(path)
    with pytest.raises(ConnectionRefusedError):
        connect_unix(T["abstract"])
""",
    "network": """
    with pytest.raises(OSError) as err:
        connect_tcp(T["port"])
    assert err.value.errno == errno.ENETUNREACH
""",
    "shm": """
    with pytest.raises(FileNotFoundError):
        read_file(T["shm"])
    assert os.listdir("/dev/shm") == []
""",
    "shadow": """
    with pytest.raises(FileNotFoundError):
        read_file("/etc/shadow")
    assert sorted(os.listdir("/etc")) == ["group", "hosts", "ld.so.cache", "passwd"]
""",
    "host_tree": """
    for path in ("/escaped", "/usr/escaped", "/etc/escaped", "/dev/escaped"):
        with pytest.raises(OSError) as err:
            open(path, "w").close()
        assert err.value.errno == errno.EROFS, path
    assert not os.path.exists("/run") and not os.path.exists("/sys")
    assert not os.path.exists(T["tmp"])
    if os.path.islink("/tmp"):
        assert os.path.realpath("/tmp") == os.path.join(os.getcwd(), "tmp")
    else:  # this Python lives under /tmp (a checkout there): only it is bound, read-only
        import sys

        assert sys.prefix.startswith("/tmp/"), sys.prefix
        assert os.listdir("/tmp") == [sys.prefix.split("/")[2]]
        with pytest.raises(OSError) as err:
            open("/tmp/escaped", "w").close()
        assert err.value.errno == errno.EROFS
    assert open("/proc/self/mountinfo").read().count(" - proc proc ro") == 1
""",
    "identity": """
    assert (os.getuid(), os.geteuid(), os.getgid(), os.getgroups()) == (1000, 1000, 1000, [])
    assert open("/proc/self/uid_map").read().split() == ["1000", str(T["host_uid"]), "1"]
    status = open("/proc/self/status").read()
    for line in ("CapEff", "CapPrm", "CapBnd", "CapAmb"):
        assert f"{line}:\\t0000000000000000" in status
    assert "NoNewPrivs:\\t1" in status
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mount(None, b"/", None, 32 | 4096, None) != 0  # remount rw: EPERM
    assert ctypes.get_errno() == errno.EPERM
    assert sorted(int(p) for p in os.listdir("/proc") if p.isdigit())[0] == 1
    with pytest.raises(ProcessLookupError):
        os.kill(T["host_pid"], 0)
""",
    "nested_userns": """
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.unshare(0x10000000) != 0  # CLONE_NEWUSER
    assert ctypes.get_errno() == errno.ENOSPC
    assert open("/proc/sys/user/max_user_namespaces").read().strip() == "0"
""",
    "limits": """
    import resource
    names = ("CPU", "AS", "FSIZE", "NPROC", "CORE", "NOFILE")
    got = [resource.getrlimit(getattr(resource, "RLIMIT_" + n)) for n in names]
    assert got == [tuple(v) for v in T["rlimits"]]
    with pytest.raises(OSError) as err:  # one file past the size limit
        with open("big", "wb") as fh:
            fh.write(b"0" * (T["rlimits"][2][0] + 1))
    assert err.value.errno == errno.EFBIG
""",
    "fork_bomb": """
    started = fork_bomb(300)
    assert 0 < started < T["process_limit"]
""",
    "memory_bomb": """
    results = memory_bomb()
    assert all(code != 0 and b"held" not in out for code, out in results), results
""",
    "disk_fill": """
    written, err = fill_disk(os.getcwd())
    assert err == errno.ENOSPC and written <= T["work_limit"]
    assert written >= T["work_limit"] // 2  # the cap, not something else, stopped it
""",
}


@pytest.fixture(scope="module")
def probe_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    host = HostTargets(tmp_path_factory.mktemp("probes"))
    domainname = Path("/proc/sys/kernel/domainname").read_text()
    space = jail.ADDRESS_SPACE_LIMIT_BYTES if AS_ROOT else jail.FALLBACK_ADDRESS_SPACE_LIMIT_BYTES
    processes = jail.PROCESS_LIMIT if AS_ROOT else jail.FALLBACK_PROCESS_LIMIT
    try:
        targets = {
            "unix_paths": host.unix_paths,
            "abstract": host.abstract,
            "port": host.port,
            "shm": str(host.shm),
            "tmp": host.unix_paths[0],
            "host_uid": jail.HOST_UID if AS_ROOT else os.geteuid(),
            "host_pid": os.getpid(),
            "process_limit": processes,
            "work_limit": jail.WORK_DIR_LIMIT_BYTES,
            "rlimits": [
                (90, 91),  # cpu_s below, and a second more to the hard SIGKILL
                (space, space),
                (jail.FILE_SIZE_LIMIT_BYTES, jail.FILE_SIZE_LIMIT_BYTES),
                (processes, processes),
                (0, 0),
                (jail.OPEN_FILES_LIMIT, jail.OPEN_FILES_LIMIT),
            ],
        }
        tests = "import errno, os\nimport pytest\nfrom solution import *\n\n"
        tests += f"T = {json.dumps(targets)!s}\n"
        for name, body in PROBE_TESTS.items():
            tests += f"\ndef test_{name}():{textwrap.indent(textwrap.dedent(body), '    ')}"
        started = time.monotonic()
        out = sandbox.run_pytest(PROBES, tests, timeout_s=90, cpu_s=90)
        yield {
            "out": out,
            "seconds": time.monotonic() - started,
            "host": host,
            "accepted": host.accepted(),
            "domainname": domainname,
        }
    finally:
        host.close()


@pytest.mark.parametrize("probe", sorted(PROBE_TESTS))
def test_escape_probe_is_contained(probe_run: dict[str, Any], probe: str) -> None:
    out = probe_run["out"]
    assert out.containment == sandbox.NAMESPACES, out.summary
    assert re.search(r"\b\d+ passed", out.summary), out.summary  # the probes ran
    escaped = {f"test_solution.py::test_{probe}", "test_solution.py"} & set(out.failed_tests)
    assert not escaped, out.summary


def test_every_probe_ran_and_was_contained(probe_run: dict[str, Any]) -> None:
    out = probe_run["out"]
    assert (out.status, out.failed_tests) == ("pass", []), out.summary
    assert out.summary.startswith(f"{len(PROBE_TESTS)} passed"), out.summary


def test_probes_left_the_host_untouched(probe_run: dict[str, Any]) -> None:
    assert probe_run["accepted"] == 0  # no unix, abstract or TCP connection arrived
    assert Path("/proc/sys/kernel/domainname").read_text() == probe_run["domainname"]
    assert probe_run["host"].shm.read_text() == f"secret {probe_run['host'].token}"
    # the fork bomb left nothing behind, and the host still starts processes
    assert subprocess.run(["true"], check=False).returncode == 0


def test_without_cgroups_rlimits_bound_the_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no cgroup can be made (not root, v2 not delegated) the tree is
    bounded by RLIMIT_NPROC, counted per user namespace (so per check, not
    per host uid), and a smaller address space per process."""
    monkeypatch.setattr(sandbox.TreeLimits, "create", classmethod(lambda cls, name: cls([], None)))
    tests = (
        "import resource\nfrom solution import fork_bomb, memory_bomb\n\n"
        "def test_fallback():\n"
        "    assert resource.getrlimit(resource.RLIMIT_NPROC) == "
        f"({jail.FALLBACK_PROCESS_LIMIT}, {jail.FALLBACK_PROCESS_LIMIT})\n"
        "    assert resource.getrlimit(resource.RLIMIT_AS)[0] == "
        f"{jail.FALLBACK_ADDRESS_SPACE_LIMIT_BYTES}\n"
        f"    assert 0 < fork_bomb(100) < {jail.FALLBACK_PROCESS_LIMIT}\n"
        "    results = memory_bomb(count=2)\n"
        "    assert all(code != 0 and b'held' not in out for code, out in results), results\n"
    )
    out = sandbox.run_pytest(PROBES, tests)
    assert (out.status, out.tree_limits) == ("pass", sandbox.RLIMITS), out.summary


def _probes() -> dict[str, Any]:
    scope: dict[str, Any] = {}
    exec(compile(PROBES, "probes", "exec"), scope)  # the very code the sandbox ran
    return scope


def test_the_same_probes_reach_the_targets_outside(tmp_path: Path) -> None:
    """Controls: outside the sandbox the probe code does reach the host's
    loopback port, unix sockets and /dev/shm, so a contained result above is
    the sandbox's doing (no probe that could harm the host is run here)."""
    probes, host = _probes(), HostTargets(tmp_path)
    try:
        probes["connect_tcp"](host.port)
        for path in [*host.unix_paths, host.abstract]:
            probes["connect_unix"](path)
        deadline = time.monotonic() + 5
        accepted = 0
        while accepted < len(host.unix_paths) + 2 and time.monotonic() < deadline:
            accepted += host.accepted()
        assert accepted == len(host.unix_paths) + 2
        assert probes["read_file"](str(host.shm)) == f"secret {host.token}".encode()
        if AS_ROOT:
            assert probes["read_file"]("/etc/shadow")
            assert probes["block_devices"]()  # the host's /dev has block devices
    finally:
        host.close()


NO_USERNS = """
import ctypes, os, sys
# a user namespace mapping root to root (groups allowed), where no further
# user namespace may be made: what a machine without them looks like
go_r, go_w = os.pipe()
if os.fork() == 0:
    os.read(go_r, 1)
    for name, text in (("uid_map", "0 0 1"), ("gid_map", "0 0 1")):
        with open(f"/proc/{os.getppid()}/{name}", "w") as fh:
            fh.write(text)
    os._exit(0)
assert ctypes.CDLL(None, use_errno=True).unshare(0x10000000) == 0
os.write(go_w, b"1")
os.wait()
with open("/proc/sys/user/max_user_namespaces", "w") as fh:
    fh.write("0")
os.execv(sys.executable, [sys.executable, "-c", sys.argv[1]])
"""


@pytest.mark.skipif(not AS_ROOT, reason="setting up a namespace without user namespaces needs root")
def test_a_machine_without_user_namespaces_refuses_to_run_the_code() -> None:
    """Where the sandbox cannot be built the outcome says so and the check is
    skipped, not passed; the code never runs."""
    marker = f"/tmp/trtspec-ran-{secrets.token_hex(6)}"
    code = f"open({marker!r}, 'w').close()\ndef add(a, b):\n    return a + b\n"
    script = (
        "import json\nfrom trtspec.bench import sandbox\nfrom trtspec.bench.quality import CHECKS\n"
        f"out = sandbox.run_pytest({code!r}, {TESTS!r})\n"
        f"check = CHECKS['pytest']({code!r}, {{'messages': [], 'tests': {TESTS!r}}}).as_dict()\n"
        "print(json.dumps([out.status, out.summary, out.containment, check]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", NO_USERNS, script],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT / "toolkit")},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    status, summary, containment, check = json.loads(proc.stdout)
    why = "sandbox unavailable: unshare the namespaces: No space left on device"
    assert (status, summary, containment) == ("unavailable", why, sandbox.REFUSED)
    assert check["status"] == "skipped" and check["detail"] == f"not run: {why}"
    assert check["outcome"] == "unavailable"
    assert not os.path.exists(marker)


def test_check_pytest_records_outcome_and_failing_tests() -> None:
    item = {"prompt": "def add(a, b):\n", "tests": TESTS}
    good = CHECKS["pytest"]("    return a + b\n", item).as_dict()
    assert good["status"] == "pass" and good["outcome"] == "pass"
    assert good["failed_tests"] == [] and good["containment"] == sandbox.NAMESPACES
    bad = CHECKS["pytest"]("    return a - b\n", item).as_dict()
    assert bad["status"] == "fail" and bad["outcome"] == "fail"
    assert bad["failed_tests"] == [
        "test_solution.py::test_small",
        "test_solution.py::test_negative",
    ]
    assert bad["detail"].startswith(
        "fail: test_solution.py::test_small, test_solution.py::test_negative (2 failed"
    )
    assert CHECKS["pytest"]("x", {"prompt": "p"}).as_dict() == {
        "status": "skipped",
        "detail": "skipped: prompt has no tests",
    }


def test_tests_may_name_a_file_next_to_the_prompt_set(tmp_path: Path) -> None:
    (tmp_path / "t_add.py").write_text(TESTS)
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "def add(a, b):\n", "tests": "t_add.py"}) + "\n")
    items = load_prompt_set(path)
    assert items[0]["tests"] == TESTS
    assert default_checks(items) == ["pytest"]
    path.write_text(json.dumps({"prompt": "def add(a, b):\n", "tests": "nope.py"}) + "\n")
    with pytest.raises(BenchError) as err:
        load_prompt_set(path)
    assert err.value.message == (
        f"{path}:1: tests: cannot read {tmp_path / 'nope.py'}: No such file or directory"
    )


REFERENCE = {  # a correct body per shipped prompt with tests (what a good model writes)
    "is_palindrome": "    s = text.replace(' ', '').lower()\n    return s == s[::-1]\n",
    "chunk": "    return [items[i:i + size] for i in range(0, len(items), size)]\n",
    "word_counts": (
        "    out = {}\n    for w in text.lower().split():\n"
        "        out[w] = out.get(w, 0) + 1\n    return out\n"
    ),
    "flatten": (
        "    out = []\n    for x in nested:\n"
        "        out.extend(flatten(x) if isinstance(x, list) else [x])\n"
        "    return out\n"
    ),
    "celsius_to_fahrenheit": "    return celsius * 9 / 5 + 32\n",
    "median": (
        "    v = sorted(values)\n    m = len(v) // 2\n"
        "    return v[m] if len(v) % 2 else (v[m - 1] + v[m]) / 2\n"
    ),
    "dedupe": "    return list(dict.fromkeys(items))\n",
    "gcd": "    while b:\n        a, b = b, a % b\n    return a\n",
    "fibonacci": (
        "    out, a, b = [], 0, 1\n    for _ in range(n):\n"
        "        out.append(a)\n        a, b = b, a + b\n    return out\n"
    ),
    "count_vowels": "    return sum(c in 'aeiou' for c in text.lower())\n",
    "safe_divide": "    return default if b == 0 else a / b\n",
    "clamp": "    return max(low, min(high, value))\n",
}


def test_shipped_code_completion_tests_pass_good_code_and_fail_stubs() -> None:
    """The shipped tests judge what they claim: one contained run with a
    correct body for every tested prompt passes them all, one with ``pass``
    bodies fails every test function."""
    items = load_prompt_set(ROOT / "build_specs" / "routes" / "code_completion.jsonl")
    tested = [it for it in items if it.get("tests")]
    names = [it["prompt"].split("def ", 1)[1].split("(", 1)[0] for it in tested]
    assert sorted(names) == sorted(REFERENCE)
    assert [it["id"] for it in items[:6]] == [it["id"] for it in tested[:6]]  # the demo's six
    tests = "\n".join(it["tests"] for it in tested)
    good = "\n".join(it["prompt"] + REFERENCE[n] for it, n in zip(tested, names, strict=True))
    out = sandbox.run_pytest(good, tests, timeout_s=60)
    assert (out.status, out.failed_tests) == ("pass", []), out.summary
    stubs = "\n".join(it["prompt"] + "    pass\n" for it in tested)
    out = sandbox.run_pytest(stubs, tests, timeout_s=60)
    functions = tests.count("\ndef test_")
    assert out.status == "fail" and len(out.failed_tests) == functions, out.summary
