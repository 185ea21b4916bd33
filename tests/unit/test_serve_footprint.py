"""The server footprint (serve/footprint.py), the supervisor's early stop once
every stub has exited, and the demo's server lines: all on small local
processes, no tritonserver."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from trtspec.demo import server_lines
from trtspec.serve import supervisor
from trtspec.serve.footprint import (
    LOADING,
    MIB,
    SERVING,
    Footprint,
    Memory,
    MemorySampler,
    group_memory,
    process_memory,
    process_name,
    top_models,
    total_memory,
)

ROLLUP = """55d0c0000000-7ffd5a3f1000 ---p 00000000 00:00 0                          [rollup]
Rss:              204800 kB
Pss:              102400 kB
Pss_Anon:          51200 kB
Shared_Clean:      81920 kB
Private_Dirty:     40960 kB
"""


def _fake_proc(tmp_path, rollups: dict[int, str]):
    for pid, text in rollups.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "smaps_rollup").write_text(text)
    return tmp_path


def test_process_memory_reads_rss_and_pss_in_bytes(tmp_path) -> None:
    proc = _fake_proc(tmp_path, {7: ROLLUP})
    assert process_memory(7, proc) == Memory(rss=200 * MIB, pss=100 * MIB, processes=1)
    assert process_memory(8, proc) is None  # gone


def test_total_memory_sums_and_skips_the_gone(tmp_path) -> None:
    proc = _fake_proc(tmp_path, {1: ROLLUP, 2: ROLLUP.replace("204800", "1024"), 3: ""})
    assert total_memory([1, 2, 3, 4], proc) == Memory(
        rss=200 * MIB + MIB, pss=200 * MIB, processes=2
    )


def _cmdline(tmp_path, pid: int, *argv: str) -> None:
    (tmp_path / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")


def test_processes_are_named_after_the_model_they_serve(tmp_path) -> None:
    proc = _fake_proc(tmp_path, {1: ROLLUP, 2: ROLLUP, 3: ROLLUP, 4: ROLLUP})
    _cmdline(tmp_path, 1, "/opt/tritonserver/bin/tritonserver", "--model-repository", "/r")
    # the stub's argv as the 2.51 python backend starts it
    stub = "/x/backends/python/triton_python_backend_stub"
    _cmdline(tmp_path, 2, stub, "/r/parity_repo/target_dte__arm2/1/model.py", "shm", "1048576")
    _cmdline(tmp_path, 3, stub, "/r/parity_repo/target_dte/1/model.py", "shm")
    _cmdline(tmp_path, 4, stub, "/r/parity_repo/target_dte/1/model.py", "shm")  # 2nd instance
    assert [process_name(p, proc) for p in (1, 2, 3, 5)] == [
        "tritonserver",
        "target_dte__arm2",
        "target_dte",
        "?",
    ]
    memory = total_memory([1, 2, 3, 4, 5], proc, by_model=True)
    assert memory.models == {
        "tritonserver": 100 * MIB,
        "target_dte__arm2": 100 * MIB,
        "target_dte": 200 * MIB,
    }
    assert sum(memory.models.values()) == memory.pss
    assert total_memory([1, 2], proc).models == {}  # only when asked


def test_top_models_names_the_largest_and_sums_the_rest() -> None:
    models = {"router": 30 * MIB, "target": 830 * MIB, "tritonserver": 310 * MIB}
    assert top_models(models, n=2) == "target 830, tritonserver 310, router 30 MiB"
    models["baseline"] = 20 * MIB
    models["sh"] = 0  # nothing resident: not named
    assert top_models(models, n=2) == "target 830, tritonserver 310, 2 others 50 MiB"
    assert top_models(models) == "target 830, tritonserver 310, router 30, baseline 20 MiB"


def test_own_process_pss_is_at_most_rss_and_sees_an_allocation() -> None:
    before = process_memory(os.getpid())
    assert before is not None and 0 < before.pss <= before.rss
    block = bytearray(48 * MIB)
    block[::4096] = b"x" * len(block[::4096])  # touch every page
    after = process_memory(os.getpid())
    assert after is not None and after.rss - before.rss >= 40 * MIB
    del block


def test_sampler_keeps_each_peak_on_its_own() -> None:
    readings = iter([Memory(10, 9, 2), Memory(30, 5, 3), Memory(20, 15, 1)])
    sampler = MemorySampler(lambda: next(readings, Memory()), interval_s=60)
    for _ in range(3):
        sampler.sample()
    assert sampler.peak() == Memory(rss=30, pss=15, processes=3)
    assert sampler.samples == 3


def test_sampler_keeps_each_models_peak_and_the_sample_at_the_peak() -> None:
    readings = iter(
        [
            Memory(10, 9, 2, {"a": 5, "b": 4}),
            Memory(20, 12, 2, {"a": 2, "b": 10}),
            Memory(20, 11, 2, {"a": 8, "b": 3}),
        ]
    )
    sampler = MemorySampler(lambda: next(readings), interval_s=60)
    for _ in range(3):
        sampler.sample()
    assert sampler.peak().models == {"a": 8, "b": 10}
    assert sampler.at_peak == Memory(20, 12, 2, {"a": 2, "b": 10})
    footprint = Footprint(1.0, sampler.peak(), 0.5, at_peak=sampler.at_peak)
    recorded = footprint.to_json()
    assert recorded["peak_pss_by_model_bytes"] == {"b": 10, "a": 8}
    assert recorded["pss_at_peak_by_model_bytes"] == {"b": 10, "a": 2}
    again = Footprint.from_json(json.loads(json.dumps(recorded)))
    assert again.peak == footprint.peak
    assert again.at_peak is not None and again.at_peak.models == {"b": 10, "a": 2}


def test_sampler_keeps_the_peak_of_each_phase_apart() -> None:
    readings = iter(
        [
            Memory(50, 40, 2, {"target": 30, "tritonserver": 10}),  # the stub loading
            Memory(40, 30, 2, {"target": 20, "tritonserver": 10}),
            Memory(40, 28, 2, {"target": 18, "tritonserver": 10}),  # ready
            Memory(45, 35, 2, {"target": 24, "tritonserver": 11}),  # requests in flight
            Memory(41, 30, 2, {"target": 20, "tritonserver": 10}),
        ]
    )
    sampler = MemorySampler(lambda: next(readings), interval_s=60)
    sampler.sample()
    sampler.sample()
    sampler.set_phase(SERVING)  # samples once itself
    sampler.sample()
    sampler.sample()
    assert sampler.at_peak_of == {
        LOADING: Memory(50, 40, 2, {"target": 30, "tritonserver": 10}),
        SERVING: Memory(45, 35, 2, {"target": 24, "tritonserver": 11}),
    }
    footprint = Footprint(
        2.0,
        Memory(rss=50 * MIB, pss=40 * MIB, processes=2),
        0.5,
        phases={
            LOADING: Memory(50 * MIB, 40 * MIB, 2, {"target": 30 * MIB, "tritonserver": 10 * MIB}),
            SERVING: Memory(45 * MIB, 35 * MIB, 2, {"target": 24 * MIB, "tritonserver": 11 * MIB}),
        },
    )
    assert footprint.lines()[2:4] == [
        "while loading: 0.04 GB PSS at most: target 30, tritonserver 10 MiB",
        "while serving: 0.04 GB PSS at most: target 24, tritonserver 11 MiB",
    ]
    recorded = footprint.to_json()
    assert recorded["phases"][SERVING] == {
        "peak_pss_bytes": 35 * MIB,
        "rss_bytes": 45 * MIB,
        "pss_by_model_bytes": {"target": 24 * MIB, "tritonserver": 11 * MIB},
    }
    assert Footprint.from_json(json.loads(json.dumps(recorded))).phases == footprint.phases


def test_sampler_on_a_real_process_group_sees_its_children() -> None:
    # a "server" and a child of its own, in their own group, as tritonserver and a stub
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        '\'b = bytearray(64 << 20); b[0:len(b):4096] = b"x" * len(b[0:len(b):4096]); '
        "print(1, flush=True); import time; time.sleep(30)'], stdout=sys.stdout)\n"
        "time.sleep(30)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"1"
        sampler = MemorySampler.of_group(proc.pid, interval_s=0.05).start()
        time.sleep(0.2)
        peak = sampler.stop()
        assert peak.processes == 2
        assert peak.rss >= 64 * MIB and 0 < peak.pss <= peak.rss
        assert sampler.samples >= 2
        assert group_memory(proc.pid).processes == 2
        # both run the interpreter: one name, both processes' PSS
        assert list(peak.models) == [os.path.basename(sys.executable)]
        assert sampler.at_peak.models[os.path.basename(sys.executable)] == sampler.at_peak.pss
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_footprint_lines_against_the_targets() -> None:
    good = Footprint(ready_s=12.34, peak=Memory(rss=4_500 * MIB, pss=3_500 * MIB, processes=12))
    assert good.lines() == [
        "ready in 12.3 s (meets the 15 s target)",
        "peak memory 3.67 GB PSS (3,500 MiB; meets the 4 GB target), 4.72 GB RSS "
        "(4,500 MiB) over 12 processes",
    ]
    bad = Footprint(
        ready_s=19.6, peak=Memory(rss=6960 * MIB, pss=6446 * MIB, processes=12), stop_s=4.8
    )
    assert bad.lines() == [
        "ready in 19.6 s (MISSES the 15 s target)",
        "peak memory 6.76 GB PSS (6,446 MiB; MISSES the 4 GB target), 7.30 GB RSS "
        "(6,960 MiB) over 12 processes",
        "stopped in 4.8 s (MISSES the 2 s target)",
    ]
    assert Footprint.from_json(bad.to_json()) == bad


def test_demo_prints_the_recorded_server(tmp_path) -> None:
    models = {"target": 830 * MIB, "tritonserver": 310 * MIB, "router": 40 * MIB}
    run = Footprint(
        ready_s=9.0,
        peak=Memory(rss=3000 * MIB, pss=2000 * MIB, processes=11, models=models),
        stop_s=1.2,
        at_peak=Memory(pss=1180 * MIB, models=models),
    )
    server = {"endpoint": None, "repo": "triton_repo/demo-cpu", "footprint": run.to_json()}
    (tmp_path / "run.json").write_text(json.dumps({"server": server}))
    assert server_lines(tmp_path) == [
        "",
        "Server (tritonserver and its stubs, on this machine):",
        "  ready in 9.0 s (meets the 15 s target)",
        "  peak memory 2.10 GB PSS (2,000 MiB; meets the 4 GB target), 3.15 GB RSS "
        "(3,000 MiB) over 11 processes",
        "  at the peak: target 830, tritonserver 310, router 40 MiB",
        "  stopped in 1.2 s (meets the 2 s target)",
    ]
    (tmp_path / "run.json").write_text(json.dumps({"complete": True}))
    assert server_lines(tmp_path) == ["", f"Server: not recorded in {tmp_path / 'run.json'}"]


def _server_with_stub(stub_s: float) -> tuple[subprocess.Popen[bytes], int]:
    """A process ignoring SIGTERM (as tritonserver does until its models are
    unloaded) with one child that also ignores it and exits after ``stub_s``."""
    script = (
        "trap '' TERM; "
        f"sleep {stub_s} & echo $!; "
        f'exec {sys.executable} -c "import time; time.sleep(30)"'
    )
    proc = subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    stub = int(proc.stdout.readline())
    return proc, stub


def test_stop_ends_the_server_once_every_stub_has_exited() -> None:
    proc, stub = _server_with_stub(0.4)
    try:
        started = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)
        assert supervisor._wait_stopped(proc, proc.pid, {stub}, grace=10.0) is True
        assert time.monotonic() - started < 3.0
        assert proc.returncode == -signal.SIGKILL
        assert supervisor.group_members(proc.pid) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_stop_waits_while_a_stub_lives_and_without_stubs() -> None:
    proc, stub = _server_with_stub(30)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            supervisor._wait_stopped(proc, proc.pid, {stub}, grace=0.3)
        with pytest.raises(subprocess.TimeoutExpired):
            supervisor._wait_stopped(proc, proc.pid, set(), grace=0.3)
        assert proc.poll() is None
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def _exit_script(in_stub: bool) -> str:
    return (
        "import atexit, sys\n"
        "import trtspec.procutil as p\n"
        f"p.in_python_backend_stub = lambda: {in_stub}\n"
        "atexit.register(print, 'teardown ran', flush=True)\n"
        "p.skip_interpreter_teardown()\n"
        "print('finalized', flush=True)\n"
        "sys.exit(3)\n"
    )


def test_a_stub_skips_the_interpreter_teardown_after_finalize() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _exit_script(True)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # the later exit handlers and the module teardown are skipped, the output kept
    assert (done.returncode, done.stdout) == (0, "finalized\n"), done.stderr


def test_outside_a_stub_the_exit_is_untouched() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _exit_script(False)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout) == (3, "finalized\nteardown ran\n"), done.stderr
    from trtspec.procutil import in_python_backend_stub

    assert not in_python_backend_stub()
