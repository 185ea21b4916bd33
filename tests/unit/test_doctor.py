"""``trtspec doctor``: the real probes on this CPU machine (GPU checks "not
available", no crash), and — with the probes replaced, the one fake here:
a GPU machine cannot run in this test — a healthy GPU container and one
with a blocker per check, each line saying what to do."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from trtspec import doctor
from trtspec.cli.main import cli
from trtspec.memory import GIB

DATA = Path(__file__).resolve().parents[1] / "data" / "model_configs"
H100 = doctor.Gpu("NVIDIA H100 80GB HBM3", 81559 << 20)

SPEC = """\
name: doc
backend: tensorrt_llm
stack: {{trtllm_version: "1.1.0", examples_dir: /app/examples}}
target: {{model: ./llama, family: llama, dtype: float16, tp: {tp}, max_batch_size: 8,
         max_input_len: 3072, max_seq_len: 4096, max_num_tokens: 8192,
         kv_cache: {{tokens_per_block: 64, free_gpu_mem_fraction: 0.9}}}}
variants:
  - {{name: lookahead, mode: lookahead, window_size: 4, ngram_size: 3, verification_set_size: 4}}
"""


def make_spec(tmp_path: Path, tp: int = 1) -> Path:
    (tmp_path / "llama").mkdir(exist_ok=True)
    shutil.copy(DATA / "llama-2-7b-hf.json", tmp_path / "llama" / "config.json")
    path = tmp_path / "doc.yaml"
    path.write_text(SPEC.format(tp=tp), encoding="utf-8")
    return path


def run(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, ["doctor", *args])


def checks_of(res) -> dict[str, dict[str, str]]:  # type: ignore[no-untyped-def]
    return {c["name"]: c for c in json.loads(res.stdout)["checks"]}


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has a GPU")
def test_cpu_machine_reports_gpu_checks_as_not_available() -> None:
    res = run("--format", "json")
    assert res.exit_code == 0, res.output
    assert res.stderr == ""
    checks = checks_of(res)
    assert list(checks) == [
        "tensorrt_llm",
        "GPUs",
        "tritonserver",
        "tensorrtllm backend",
        "/dev/shm",
    ]
    assert checks["GPUs"] == {
        "name": "GPUs",
        "status": "not available",
        "detail": "nvidia-smi not found or failed",
        "fix": "",
    }
    if doctor.probe_trtllm_version() is None:
        assert checks["tensorrt_llm"]["status"] == "not available"
    if not doctor.BACKEND_DIR.is_dir():
        assert checks["tensorrtllm backend"] == {
            "name": "tensorrtllm backend",
            "status": "not available",
            "detail": "/opt/tritonserver/backends/tensorrtllm missing",
            "fix": "only the reference backend can serve here",
        }
    # the nvidia-pytriton wheel's tritonserver is found for real
    assert checks["tritonserver"]["status"] == "ok"
    assert checks["tritonserver"]["detail"].endswith("/bin/tritonserver")
    # the table form of the same
    table = run()
    assert table.exit_code == 0, table.output
    assert table.stdout.splitlines()[0].split() == ["check", "status", "detail", "what", "to", "do"]


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has a GPU")
def test_cpu_machine_with_a_gpu_spec_names_the_blockers(tmp_path: Path) -> None:
    res = run(str(make_spec(tmp_path)), "--format", "json")
    checks = checks_of(res)
    assert checks["GPUs"]["status"] == checks["GPU memory"]["status"] == "not available"
    assert checks["GPU memory"]["fix"] == "rerun doctor where the GPUs are visible"
    if doctor.probe_trtllm_version() is None and shutil.which("trtllm-build") is None:
        assert res.exit_code == 1
        assert checks["tensorrt_llm"] == {
            "name": "tensorrt_llm",
            "status": "blocker",
            "detail": "not installed",
            "fix": "run inside nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3 "
            "(TensorRT-LLM 1.1.0)",
        }
        assert res.stderr.startswith(
            "Error: 4 blockers: tensorrt_llm, trtllm-build, examples scripts, tensorrtllm backend\n"
        )


@pytest.fixture
def gpu_machine(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """A healthy Triton TRT-LLM 25.12 container with one H100."""
    state = {"version": "1.1.0", "gpus": [H100], "shm": 2 * GIB, "missing": set()}
    monkeypatch.setattr(doctor, "probe_trtllm_version", lambda: state["version"])
    monkeypatch.setattr(doctor, "probe_gpus", lambda: state["gpus"])
    monkeypatch.setattr(doctor, "probe_which", lambda cmd: f"/usr/local/bin/{cmd}")
    monkeypatch.setattr(doctor, "probe_exists", lambda path: path not in state["missing"])
    monkeypatch.setattr(doctor, "probe_tritonserver", lambda: "/opt/tritonserver/bin/tritonserver")
    monkeypatch.setattr(doctor, "probe_backend", lambda: True)
    monkeypatch.setattr(doctor, "probe_shm", lambda: state["shm"])
    return state


def test_healthy_gpu_container(tmp_path: Path, gpu_machine) -> None:
    res = run(str(make_spec(tmp_path)), "--engines", str(tmp_path / "engines"))
    assert res.exit_code == 0, res.output
    assert res.stderr == ""
    rows = [line.split("  ")[0] for line in res.stdout.splitlines()[2:]]
    assert rows == [
        "tensorrt_llm",
        "trtllm-build",
        "examples scripts",
        "GPUs",
        "GPU memory",
        "tritonserver",
        "tensorrtllm backend",
        "/dev/shm",
    ]
    checks = checks_of(run(str(make_spec(tmp_path)), "--format", "json"))
    assert checks["tensorrt_llm"]["detail"] == "1.1.0 installed, the spec pins 1.1.0"
    assert checks["examples scripts"]["detail"] == ("1 found under /app/examples/models/core/llama")
    assert checks["GPUs"]["detail"] == "1 (NVIDIA H100 80GB HBM3), the spec needs TP×PP = 1"
    assert checks["GPU memory"] == {
        "name": "GPU memory",
        "status": "ok",
        # the lookahead engine is built with max_seq_len 4096 + 15 (trtllm-build adds
        # max_draft_len): 65 blocks of 64 tokens, 0.25 GiB more KV than the baseline's
        "detail": "79.6 GiB per GPU; the repository needs at least 32.3 GiB, 60.5 GiB for a "
        "full KV cache",
        "fix": "",
    }
    assert {c["status"] for c in checks.values()} == {"ok"}


def test_each_blocker_says_what_to_do(tmp_path: Path, gpu_machine) -> None:
    gpu_machine.update(
        version="0.20.0",
        gpus=[doctor.Gpu("NVIDIA GeForce RTX 3070", 8192 << 20)],
        shm=64 << 20,
        missing={"/app/examples/models/core/llama/convert_checkpoint.py"},
    )
    res = run(str(make_spec(tmp_path, tp=2)), "--format", "json")
    assert res.exit_code == 1
    assert res.stderr == (
        "Error: 4 blockers: tensorrt_llm, examples scripts, GPUs, GPU memory\n"
        "Hint: fix the lines marked blocker above, then rerun `trtspec doctor`\n"
    )
    checks = checks_of(res)
    assert checks["tensorrt_llm"] == {
        "name": "tensorrt_llm",
        "status": "blocker",
        "detail": "0.20.0 installed, the spec pins 1.1.0",
        "fix": "use nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3, or set "
        'stack.trtllm_version to "0.20.0" (flags and tensors differ between versions)',
    }
    assert checks["examples scripts"] == {
        "name": "examples scripts",
        "status": "blocker",
        "detail": "missing: /app/examples/models/core/llama/convert_checkpoint.py",
        "fix": "point stack.examples_dir (or --examples-dir) at the TensorRT-LLM examples "
        "folder of version 1.1.0",
    }
    assert checks["GPUs"] == {
        "name": "GPUs",
        "status": "blocker",
        "detail": "1 (NVIDIA GeForce RTX 3070), the spec needs TP×PP = 2",
        "fix": "give the container more GPUs (`--gpus all`) or lower target.tp / target.pp",
    }
    # per GPU at TP 2: 6.3 GiB of weights + 0.3 activations + 0.5 runtime, 1 GiB of
    # CUDA context, 1 GiB for one 4096-token sequence
    assert checks["GPU memory"] == {
        "name": "GPU memory",
        "status": "blocker",
        "detail": "8.0 GiB per GPU; the repository needs at least 17.2 GiB, 31.3 GiB for a "
        "full KV cache",
        "fix": "the repository's 2 engines need at least 17.2 GiB but the GPU has 8.0 GiB; "
        "the baseline alone needs 9.1 GiB: quantize the target or raise target.tp; "
        "variant lookahead alone needs 9.1 GiB: drop it, quantize, or raise target.tp",
    }
    assert checks["/dev/shm"] == {
        "name": "/dev/shm",
        "status": "warn",
        "detail": "0.1 GiB, below 2.0 GiB",
        "fix": "start the container with `--shm-size=2g` (Python models pass tensors through it)",
    }


def test_patch_release_mismatch_is_a_warning(tmp_path: Path, gpu_machine) -> None:
    gpu_machine.update(version="1.1.1")
    res = run(str(make_spec(tmp_path)), "--format", "json")
    assert res.exit_code == 0, res.output
    assert checks_of(res)["tensorrt_llm"] == {
        "name": "tensorrt_llm",
        "status": "warn",
        "detail": "1.1.1 installed, the spec pins 1.1.0",
        "fix": 'set stack.trtllm_version: "1.1.1" so the build cache records what really '
        "built the engines",
    }


def test_nvidia_smi_is_read_through_the_subprocess_chokepoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        "[ \"$1 $2\" = '--query-gpu=name,memory.total --format=csv,noheader,nounits' ]"
        " || exit 9\n"
        "echo 'NVIDIA H200, 143771'\necho 'NVIDIA H200, 143771'\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    assert doctor.probe_gpus() == [doctor.Gpu("NVIDIA H200", 143771 << 20)] * 2
    fake.write_text("#!/bin/sh\nexit 3\n")
    assert doctor.probe_gpus() is None


def test_the_building_gpu_is_read_for_the_engines_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `trtspec build` records beside GPU engines (trtspec.json `gpu`) and
    `trtspec deploy k8s` turns into GPU node affinity: nvidia-smi's name and
    compute_cap of the first GPU."""
    from trtspec.build import executor

    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        "[ \"$1 $2\" = '--query-gpu=name,compute_cap --format=csv,noheader' ] || exit 9\n"
        "echo 'NVIDIA H200, 9.0'\necho 'NVIDIA H200, 9.0'\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    assert doctor.probe_build_gpu() == {"name": "NVIDIA H200", "compute_capability": "9.0"}
    assert executor._build_gpu() == {"name": "NVIDIA H200", "compute_capability": "9.0"}
    fake.write_text("#!/bin/sh\nexit 3\n")
    assert doctor.probe_build_gpu() is None


def test_instances_need_gpus_of_their_own(tmp_path: Path, gpu_machine) -> None:
    """Two instances of a one-GPU engine sit on GPUs 0 and 1 (trtspec.plan.placement)."""
    path = make_spec(tmp_path)
    path.write_text(
        path.read_text(encoding="utf-8").replace("tp: 1,", "tp: 1, instances: 2,"),
        encoding="utf-8",
    )
    res = run(str(path), "--format", "json")
    assert res.exit_code == 1, res.output
    assert checks_of(res)["GPUs"] == {
        "name": "GPUs",
        "status": "blocker",
        "detail": "1 (NVIDIA H100 80GB HBM3), the spec needs TP×PP × instances = 2",
        "fix": "give the container more GPUs (`--gpus all`) or lower target.tp / target.pp / "
        "target.instances",
    }


def test_examples_dir_option_overrides_the_spec(tmp_path: Path, gpu_machine) -> None:
    spec = str(make_spec(tmp_path))
    # the spec's /app/examples is not there; --examples-dir names where they are
    gpu_machine["missing"] = {"/app/examples/models/core/llama/convert_checkpoint.py"}
    checks = checks_of(run(spec, "--format", "json"))
    assert checks["examples scripts"]["status"] == "blocker"
    res = run(spec, "--examples-dir", "/opt/trtllm/examples", "--format", "json")
    assert res.exit_code == 0, res.output
    assert checks_of(res)["examples scripts"] == {
        "name": "examples scripts",
        "status": "ok",
        "detail": "1 found under /opt/trtllm/examples/models/core/llama",
        "fix": "",
    }
