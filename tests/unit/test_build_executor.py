"""The executor with real subprocesses: staging + rename, manifests, logs,
cache skips, --force, --only, failures with the output tail, and a build
SIGKILLed mid-step that leaves nothing a later run trusts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from trtspec.build.executor import (
    SHARED_WEIGHTS,
    ReferenceBackend,
    TrtllmBackend,
    execute,
    is_cached,
    plan_status,
    run_subprocess,
)
from trtspec.errors import StepFailed, TrtspecError
from trtspec.plan import EnginePlan, Plan, Step, VariantEngines

WRITE_A = textwrap.dedent("""\
    import os, sys, time
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    flag = sys.argv[2]
    open(os.path.join(out, "pid"), "w").write(str(os.getpid()))
    print("converting", flush=True)
    if os.path.exists(flag):
        time.sleep(60)
    open(os.path.join(out, "weights.bin"), "w").write("w")
    print("converted", flush=True)
""")
WRITE_B = textwrap.dedent("""\
    import json, os, sys
    src, out = sys.argv[1], sys.argv[2]
    assert open(os.path.join(src, "weights.bin")).read() == "w"
    os.makedirs(out, exist_ok=True)
    cfg = {"version": "1.1.0", "pretrained_config": {"architecture": "LlamaForCausalLM"},
           "build_config": {"max_batch_size": 2, "max_draft_len": 4,
                            "speculative_decoding_mode": 2}}
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"))
    print("built engine", flush=True)
""")


def make_plan_for(root: Path, flag: Path, b_code: str = WRITE_B) -> Plan:
    ckpt, eng = str(root / ".checkpoints" / "target"), str(root / "target_dte")
    steps = [
        Step(
            id="convert:target",
            kind="convert",
            unit=ckpt,
            argv=("python", "-c", WRITE_A, ckpt, str(flag)),
            cwd=None,
            env={},
            inputs=(),
            outputs=(ckpt,),
            cache_key="k1",
            engine=None,
            description="convert target",
        ),
        Step(
            id="build:target_dte",
            kind="build",
            unit=eng,
            argv=("python", "-c", b_code, ckpt, eng),
            cwd=None,
            env={"X": "1"},
            inputs=(ckpt,),
            outputs=(eng,),
            cache_key="k2",
            engine="target_dte",
            description="build target_dte",
        ),
    ]
    engine = EnginePlan(
        name="target_dte",
        role="target",
        mode="draft_tokens_external",
        max_draft_len=4,
        source="m",
        dir=Path(eng),
        variants=("ngram",),
    )
    return Plan(
        spec_name="t",
        spec_hash="h",
        backend="reference",
        root=root,
        engines=[engine],
        steps=steps,
        variants={"ngram": VariantEngines("target_dte", None, "ngram")},
    )


class Recorder:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, argv, cwd, env, log):  # type: ignore[no-untyped-def]
        self.calls.append(list(argv))
        run_subprocess(argv, cwd, env, log)


def test_build_stages_renames_and_caches(tmp_path: Path) -> None:
    root = tmp_path / "engines" / "t"
    plan = make_plan_for(root, tmp_path / "no-flag")
    rec = Recorder()
    messages: list[str] = []
    result = execute(plan, backend=ReferenceBackend(), runner=rec, progress=messages.append)
    assert [o.status for o in result.outcomes] == ["ran", "ran"]
    assert rec.calls[0][0] == sys.executable  # "python" resolved at execution time
    staging = str(root / ".staging")
    assert rec.calls[0][3].startswith(staging) and rec.calls[1][4].startswith(staging)
    assert rec.calls[1][3] == str(root / ".checkpoints" / "target")  # inputs read from final
    eng = root / "target_dte"
    manifest = json.loads((eng / "trtspec.json").read_text())
    assert manifest["spec"] == "t" and manifest["spec_hash"] == "h"
    assert [s["cache_key"] for s in manifest["steps"]] == ["k2"]
    assert manifest["config_summary"]["speculative_mode_name"] == "draft_tokens_external"
    assert manifest["engine"]["name"] == "target_dte"
    assert "built engine" in (eng / "build.log").read_text()
    assert list((root / ".staging").iterdir()) == []
    assert messages[0] == "[1/2] convert target ..."

    rec2 = Recorder()
    again = execute(plan, backend=ReferenceBackend(), runner=rec2)
    assert rec2.calls == [] and [o.status for o in again.outcomes] == ["cached", "cached"]
    assert all(c for _, c in plan_status(plan))

    rec3 = Recorder()
    execute(plan, backend=ReferenceBackend(), runner=rec3, force=True)
    assert len(rec3.calls) == 2


def test_changed_key_rebuilds_only_that_unit(tmp_path: Path) -> None:
    root = tmp_path / "engines" / "t"
    plan = make_plan_for(root, tmp_path / "no-flag")
    execute(plan, backend=ReferenceBackend())
    # the packed weights the spec's engines share (runtime/engine/shared_weights.py):
    # kept while nothing is rebuilt, removed with a rebuilt engine's old weights
    shared = root / SHARED_WEIGHTS / "packed-0.bin"
    shared.parent.mkdir()
    shared.write_bytes(b"old")
    execute(plan, backend=ReferenceBackend())
    assert shared.is_file()
    steps = list(plan.steps)
    steps[1] = Step(
        **{
            **steps[1].to_dict(),
            "argv": steps[1].argv,
            "inputs": steps[1].inputs,
            "outputs": steps[1].outputs,
            "cache_key": "k2-new",
        }
    )
    plan.steps = steps
    assert is_cached(plan, steps[0].unit) and not is_cached(plan, steps[1].unit)
    rec = Recorder()
    execute(plan, backend=ReferenceBackend(), runner=rec)
    assert len(rec.calls) == 1 and rec.calls[0][2] == WRITE_B
    assert not shared.parent.exists()


def test_only_selects_needed_units(tmp_path: Path) -> None:
    plan = make_plan_for(tmp_path / "e" / "t", tmp_path / "no-flag")
    assert [s.id for s, _ in plan_status(plan, only="ngram")] == [
        "convert:target",
        "build:target_dte",
    ]
    with pytest.raises(KeyError):
        plan_status(plan, only="nope")


def test_failure_reports_tail_and_leaves_nothing(tmp_path: Path) -> None:
    root = tmp_path / "engines" / "t"
    bad = "import sys\nfor i in range(40): print('line', i)\nsys.exit(3)\n"
    plan = make_plan_for(root, tmp_path / "no-flag", b_code=bad)
    with pytest.raises(StepFailed) as err:
        execute(plan, backend=ReferenceBackend())
    msg = err.value.message
    first_line = msg.splitlines()[0]
    assert first_line.startswith("step build:target_dte failed: command failed with exit code 3: ")
    assert "-c 'import sys" in first_line or "'import sys" in msg
    assert msg.splitlines()[-1] == "    line 39"
    assert "line 9\n" not in msg and "    line 10" in msg  # the last 30 lines only
    log = root / ".logs" / "target_dte.build.log"
    assert err.value.hint == f"full log: {log}"
    assert "line 0" in log.read_text()
    assert not (root / "target_dte").exists()
    assert (root / ".checkpoints" / "target" / "trtspec.json").is_file()  # finished unit kept
    assert list((root / ".staging").iterdir()) == []


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (ENOSPC on write)")
def test_a_step_on_a_full_disk_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    """Issue 28: a build step whose tool dies of ENOSPC (here a real one:
    writing /dev/full) printed the tool's traceback as its last output."""
    root = tmp_path / "engines" / "t"
    full = "open('/dev/full', 'w').write('x' * 65536)\n"
    plan = make_plan_for(root, tmp_path / "no-flag", b_code=full)
    with pytest.raises(StepFailed) as err:
        execute(plan, backend=ReferenceBackend())
    msg = err.value.message
    assert msg.startswith(
        "step build:target_dte failed: command failed with exit code 1: no space left on the "
        "device (the tool said 'No space left on device'): "
    )
    assert "Traceback" not in msg and "OSError" not in msg and "last output" not in msg
    log = root / ".logs" / "target_dte.build.log"
    assert err.value.hint == (
        "free space on the disk of the engines folder (see `df -h`) or build elsewhere "
        f"(--engines-dir); units built before are complete; full log: {log}"
    )
    assert "Traceback" in log.read_text()  # the tool's own words stay in the log
    assert list((root / ".staging").iterdir()) == []


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (ENOSPC on write)")
def test_the_reference_builder_says_disk_full_plainly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from trtspec.build import reference

    def fill(_args: object) -> None:
        with open("/dev/full", "w") as f:
            f.write("x" * 65536)

    monkeypatch.setattr(reference, "build", fill)
    monkeypatch.setattr(
        reference, "parse_args", lambda argv: type("A", (), {"output": str(tmp_path / "o")})()
    )
    assert reference.main([]) == 1
    err = capsys.readouterr().err
    # the failed flush names no file: the engine folder being written is named
    assert err.splitlines()[0] == f"Error: {tmp_path / 'o'}: no space left on the device"
    assert "Traceback" not in err


def test_missing_command_is_a_clean_error(tmp_path: Path) -> None:
    with pytest.raises(StepFailed) as err:
        run_subprocess(["trtspec-no-such-tool", "--x"], log=tmp_path / "log")
    assert err.value.message == (
        "cannot run 'trtspec-no-such-tool': command not found (trtspec-no-such-tool --x)"
    )


def test_trtllm_preflight_without_container(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    plan = make_plan_for(tmp_path / "e" / "t", tmp_path / "no-flag")
    with pytest.raises(TrtspecError) as err:
        TrtllmBackend().preflight(plan, list(plan.steps))
    assert err.value.message == (
        "trtllm-build is not on PATH; TensorRT-LLM engines can only be "
        "built where TensorRT-LLM is installed"
    )


CHILD = """\
import json, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_build_executor import make_plan_for
from trtspec.build.executor import ReferenceBackend, execute
execute(make_plan_for(Path({root!r}), Path({flag!r})), backend=ReferenceBackend())
"""


@pytest.mark.slow
def test_sigkill_mid_step_leaves_no_trusted_folder(tmp_path: Path) -> None:
    root = tmp_path / "engines" / "t"
    flag = tmp_path / "slow"
    flag.write_text("")
    code = CHILD.format(tests=str(Path(__file__).parent), root=str(root), flag=str(flag))
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 30
        pid_file = None
        while time.monotonic() < deadline and pid_file is None:
            found = list((root / ".staging").glob("*/pid")) if (root / ".staging").is_dir() else []
            pid_file = found[0] if found and found[0].read_text() else None
            time.sleep(0.05)
        assert pid_file is not None, "the step never started"
        step_pid = int(pid_file.read_text())
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for _ in range(100):  # the step dies with its parent (PR_SET_PDEATHSIG)
        try:
            os.kill(step_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(step_pid, signal.SIGKILL)
        pytest.fail("the step outlived the killed build")
    assert not (root / ".checkpoints" / "target").exists()
    assert not (root / "target_dte").exists()
    assert list((root / ".staging").iterdir())  # only the untrusted staging folder remains

    flag.unlink()
    plan = make_plan_for(root, flag)
    assert not any(c for _, c in plan_status(plan))
    result = execute(plan, backend=ReferenceBackend())
    assert [o.status for o in result.outcomes] == ["ran", "ran"]
    assert list((root / ".staging").iterdir()) == []  # the dead build's folder was cleaned
    assert (root / "target_dte" / "config.json").is_file()


def test_manifest_records_files_and_the_cache_rebuilds_a_damaged_unit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hashlib

    from trtspec import integrity

    root = tmp_path / "engines" / "t"
    plan = make_plan_for(root, tmp_path / "no-flag")
    execute(plan, backend=ReferenceBackend())
    ckpt = root / ".checkpoints" / "target"
    files = json.loads((ckpt / "trtspec.json").read_text())["files"]
    assert sorted(files) == ["build.log", "pid", "weights.bin"]  # not the manifest itself
    assert files["weights.bin"] == {"size": 1, "sha256": hashlib.sha256(b"w").hexdigest()}
    assert plan_status(plan) == [(s, True) for s in plan.steps]

    # Same size, other content: a hashed (small) file.
    (ckpt / "weights.bin").write_text("x")
    assert not is_cached(plan, str(ckpt)) and is_cached(plan, str(root / "target_dte"))
    # Deleted: the build says why it rebuilds, and rebuilds only that unit.
    (ckpt / "weights.bin").unlink()
    messages: list[str] = []
    result = execute(plan, backend=ReferenceBackend(), progress=messages.append)
    assert messages[0] == (
        f"{ckpt}: files differ from its trtspec.json (weights.bin: missing); rebuilding"
    )
    assert [o.status for o in result.outcomes] == ["ran", "cached"]
    assert (ckpt / "weights.bin").read_text() == "w"

    # Files above the hash limit are checked by size: a truncated one is caught.
    monkeypatch.setattr(integrity, "HASH_MAX_BYTES", 0)
    execute(plan, backend=ReferenceBackend(), force=True)
    assert json.loads((ckpt / "trtspec.json").read_text())["files"]["weights.bin"] == {
        "size": 1,
        "sha256": None,
    }
    (ckpt / "weights.bin").write_text("")
    assert integrity.verify_files(ckpt, json.loads((ckpt / "trtspec.json").read_text())) == [
        ("weights.bin", "0 bytes, but 1 when built (truncated?)")
    ]
    assert not is_cached(plan, str(ckpt))

    # A manifest from before file records keeps its cache (unverifiable, not rebuilt).
    manifest = json.loads((ckpt / "trtspec.json").read_text())
    del manifest["files"]
    (ckpt / "trtspec.json").write_text(json.dumps(manifest))
    assert integrity.verify_files(ckpt, manifest) is None
    assert is_cached(plan, str(ckpt))


WRITE_WEIGHTS = textwrap.dedent("""\
    import os, sys
    out, fill = sys.argv[1], sys.argv[2]
    os.makedirs(os.path.join(out, "hf"), exist_ok=True)
    open(os.path.join(out, "hf", "model.safetensors"), "w").write(fill * 4096)
    open(os.path.join(out, "small.txt"), "w").write(fill * 16)
""")


def _weights_plan(root: Path, fills: dict[str, str], backend: str = "reference") -> Plan:
    steps = [
        Step(
            id=f"build:{name}",
            kind="build",
            unit=str(root / name),
            argv=("python", "-c", WRITE_WEIGHTS, str(root / name), fill),
            cwd=None,
            env={},
            inputs=(),
            outputs=(str(root / name),),
            cache_key=f"{name}:{fill}",
            engine=None,
            description=f"build {name}",
        )
        for name, fill in fills.items()
    ]
    return Plan(
        spec_name="t",
        spec_hash="h",
        backend=backend,
        root=root,
        engines=[],
        steps=steps,
        variants={},
    )


def test_reference_units_store_identical_large_files_once(tmp_path: Path, monkeypatch) -> None:
    """The demo's four engines hold the same 513 MB model.safetensors: the
    build stores it once (hard links to root/.blobs/<sha256>), keeps files
    under the size limit as they are, and drops a blob no unit links."""
    import hashlib
    import os

    from trtspec.build import executor

    monkeypatch.setattr(executor, "SHARE_MIN_BYTES", 1024)
    root = tmp_path / "engines" / "t"
    execute(_weights_plan(root, {"target": "a", "target_dte": "a", "other": "b"}))
    a, dte, other = (
        root / n / "hf" / "model.safetensors" for n in ("target", "target_dte", "other")
    )
    blob = root / ".blobs" / hashlib.sha256(b"a" * 4096).hexdigest()
    assert os.stat(a).st_ino == os.stat(dte).st_ino == os.stat(blob).st_ino
    assert os.stat(blob).st_nlink == 3 and a.read_text() == "a" * 4096
    assert os.stat(other).st_ino != os.stat(a).st_ino and os.stat(other).st_nlink == 2
    assert os.stat(root / "target" / "small.txt").st_nlink == 1  # under the limit
    plan = _weights_plan(root, {"target": "a", "target_dte": "a", "other": "b"})
    assert all(is_cached(plan, s.unit) for s in plan.steps)  # the records still hold

    # Both "a" units rebuilt with other bytes: the "a" blob is linked by no
    # unit any more and goes; nothing the old units held is changed.
    execute(_weights_plan(root, {"target": "c", "target_dte": "c", "other": "b"}))
    assert not blob.exists() and a.read_text() == "c" * 4096
    assert os.stat(a).st_ino == os.stat(dte).st_ino and os.stat(a).st_nlink == 3
    assert sorted(p.name for p in (root / ".blobs").iterdir()) == sorted(
        hashlib.sha256(f.encode() * 4096).hexdigest() for f in "bc"
    )


def test_other_backends_keep_their_copies(tmp_path: Path, monkeypatch) -> None:
    """TensorRT-LLM engines differ between units; hashing them (GBs) is not
    worth it, and their checkpoints are already converted once."""
    import os

    from trtspec.build import executor

    monkeypatch.setattr(executor, "SHARE_MIN_BYTES", 1024)
    root = tmp_path / "engines" / "t"
    plan = _weights_plan(root, {"target": "a", "target_dte": "a"}, backend="tensorrt_llm")
    execute(plan, backend=ReferenceBackend())
    assert not (root / ".blobs").exists()
    assert os.stat(root / "target" / "hf" / "model.safetensors").st_nlink == 1
