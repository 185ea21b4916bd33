"""The pytest quality check (trtspec.bench.sandbox + quality.check_pytest):
real `python -m pytest` children that pass, fail and time out; generated
code that writes outside its folder, opens a network connection or loops
forever is contained; a prompt's `tests` may name a file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trtspec.bench import sandbox
from trtspec.bench.quality import CHECKS, default_checks
from trtspec.bench.routes import load_prompt_set
from trtspec.errors import BenchError

ROOT = Path(__file__).resolve().parents[2]
NAMESPACES = os.geteuid() == 0  # this machine runs the tests as root: namespaces apply
TESTS = (
    "from solution import add\n\n"
    "def test_small():\n    assert add(1, 2) == 3\n\n"
    "def test_negative():\n    assert add(-1, -2) == -3\n"
)


def test_passing_code_passes() -> None:
    out = sandbox.run_pytest("def add(a, b):\n    return a + b\n", TESTS)
    assert (out.status, out.failed_tests) == ("pass", [])
    assert out.summary.startswith("2 passed")


def test_failing_code_names_the_failing_tests() -> None:
    out = sandbox.run_pytest("def add(a, b):\n    return a + abs(b)\n", TESTS)
    assert out.status == "fail"
    assert out.failed_tests == ["test_solution.py::test_negative"]
    assert out.summary.startswith("1 failed, 1 passed")


def test_code_that_does_not_import_fails_as_a_collection_error() -> None:
    out = sandbox.run_pytest("def add(a, b)\n    return a + b\n", TESTS)
    assert out.status == "fail"
    assert out.failed_tests == ["test_solution.py"]


def test_an_endless_loop_times_out_and_leaves_no_process() -> None:
    code = "def add(a, b):\n    while True:\n        pass\n"
    out = sandbox.run_pytest(code, TESTS, timeout_s=3)
    assert out.status == "timeout"
    assert out.summary == "timed out after 3s"
    # the whole process group was killed: no child running in a check folder survives
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        assert b"trtspec-pytest-" not in cmd


def test_a_busy_loop_is_stopped_by_the_cpu_limit_not_the_clock() -> None:
    code = "def add(a, b):\n    while True:\n        pass\n"
    out = sandbox.run_pytest(code, TESTS, timeout_s=600, cpu_s=2)
    assert out.status == "timeout"
    assert out.summary == "CPU time limit hit"


def test_the_child_runs_under_resource_limits() -> None:
    code = (
        "import resource\n"
        "LIMITS = [resource.getrlimit(r)[0] for r in (resource.RLIMIT_CPU, "
        "resource.RLIMIT_AS, resource.RLIMIT_FSIZE)]\n"
    )
    tests = (
        "from solution import LIMITS\n\n"
        "def test_limits():\n"
        f"    assert LIMITS == [7, {sandbox.MEMORY_LIMIT_BYTES}, "
        f"{sandbox.FILE_SIZE_LIMIT_BYTES}]\n"
    )
    out = sandbox.run_pytest(code, tests, cpu_s=7)
    assert out.status == "pass", out.summary


def test_the_environment_has_no_proxies_or_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    tests = (
        "import os\n\n"
        "def test_env():\n"
        "    assert not any('proxy' in k.lower() or 'SECRET' in k for k in os.environ)\n"
        "    assert os.getcwd() == os.environ['HOME']\n"
    )
    out = sandbox.run_pytest("", tests)
    assert out.status == "pass", out.summary


@pytest.mark.skipif(not NAMESPACES, reason="mount/network namespaces need root")
def test_writes_outside_the_check_folder_are_refused(tmp_path: Path) -> None:
    target = tmp_path / "escaped.txt"
    code = (
        f"def escape():\n    with open({str(target)!r}, 'w') as fh:\n"
        "        fh.write('out')\n"
        "def write_home():\n    import os\n"
        "    with open(os.environ['HOME'] + '/inside.txt', 'w') as fh:\n"
        "        fh.write('in')\n"
    )
    tests = (
        "import errno\nimport pytest\nfrom solution import escape, write_home\n\n"
        "def test_escape():\n    with pytest.raises(OSError) as err:\n        escape()\n"
        "    assert err.value.errno == errno.EROFS\n\n"
        "def test_home_is_writable():\n    write_home()\n"
    )
    out = sandbox.run_pytest(code, tests)
    assert out.status == "pass", out.summary
    assert out.containment == sandbox.NAMESPACES
    assert not target.exists()
    # and the same code outside the sandbox would have written the file
    assert os.access(tmp_path, os.W_OK)


@pytest.mark.skipif(not NAMESPACES, reason="namespaces need root")
def test_code_cannot_undo_its_containment_or_see_other_processes() -> None:
    tests = (
        "import ctypes, os, signal\nimport pytest\n\n"
        "def test_no_capabilities():\n"
        "    status = open('/proc/self/status').read()\n"
        "    assert 'CapEff:\\t0000000000000000' in status\n"
        "    assert 'CapBnd:\\t0000000000000000' in status\n\n"
        "def test_cannot_remount_writable():\n"
        "    libc = ctypes.CDLL(None, use_errno=True)\n"
        "    assert libc.mount(None, b'/', None, 32 | 4096, None) != 0\n"
        "    assert ctypes.get_errno() == 1  # EPERM\n\n"
        "def test_alone_in_its_pid_namespace():\n"
        "    pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
        "    assert pids[0] == 1 and len(pids) < 5\n"
        "    with pytest.raises(ProcessLookupError):\n"
        f"        os.kill({os.getpid()}, 0)\n"
    )
    out = sandbox.run_pytest("", tests)
    assert out.status == "pass", out.summary


@pytest.mark.skipif(not NAMESPACES, reason="network namespaces need root")
def test_no_network_inside_the_sandbox() -> None:
    tests = (
        "import socket\nimport pytest\n\n"
        "def test_no_route():\n"
        "    with pytest.raises(OSError):\n"
        "        socket.create_connection(('127.0.0.1', 22), timeout=2)\n"
        "    with pytest.raises(OSError):\n"
        "        socket.create_connection(('93.184.216.34', 80), timeout=2)\n"
    )
    out = sandbox.run_pytest("", tests)
    assert out.status == "pass", out.summary


def test_a_huge_file_is_cut_by_the_file_size_limit() -> None:
    tests = (
        "import pytest\n\n"
        "def test_big():\n"
        "    with pytest.raises(OSError):\n"
        "        with open('big', 'wb') as fh:\n"
        f"            fh.write(b'0' * {sandbox.FILE_SIZE_LIMIT_BYTES + 1})\n"
    )
    out = sandbox.run_pytest("", tests)
    assert out.status == "pass", out.summary


def test_check_pytest_records_outcome_and_failing_tests() -> None:
    item = {"prompt": "def add(a, b):\n", "tests": TESTS}
    good = CHECKS["pytest"]("    return a + b\n", item).as_dict()
    assert good["status"] == "pass" and good["outcome"] == "pass"
    assert good["failed_tests"] == []
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
