"""``trtspec doctor``: check the machine before a forty-minute build.

Meant for inside the Triton TRT-LLM container: the installed
``tensorrt_llm`` version against the spec's pin (read with
``importlib.metadata``; importing it would need a GPU), ``trtllm-build`` and
the ``examples_dir`` scripts the plan will call, the GPU count against
TP×PP, the GPU memory against the memory plan (``trtspec.memory``),
``tritonserver`` and its ``tensorrtllm`` backend, and the size of
``/dev/shm``. Each check is one line with a status and, unless it passed,
what to do. What cannot be probed here (no GPU, no ``nvidia-smi``) is
reported as "not available", never guessed. The probes are module functions
so tests can stand in for a GPU machine. No Click here.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trtspec.memory import GIB, gib
from trtspec.procutil import dist_version

OK, WARN, BLOCKER, NOT_AVAILABLE, SKIPPED = "ok", "warn", "blocker", "not available", "skipped"
BACKEND_DIR = Path("/opt/tritonserver/backends/tensorrtllm")
BACKEND_LIBRARY = "libtriton_tensorrtllm.so"
SHM = Path("/dev/shm")
# NVIDIA's tensorrtllm_backend README (v0.19.0) starts the container with
# --shm-size=2g; the Python backend models exchange tensors through it.
SHM_RECOMMENDED = 2 * GIB
NVIDIA_SMI_QUERY = ("--query-gpu=name,memory.total", "--format=csv,noheader,nounits")


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_bytes: int


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # OK | WARN | BLOCKER | NOT_AVAILABLE | SKIPPED
    detail: str
    fix: str = ""


# ---------------------------------------------------------------- probes
def probe_trtllm_version() -> str | None:
    """The installed tensorrt_llm distribution's version (never imported)."""
    for name in ("tensorrt_llm", "tensorrt-llm"):
        version = dist_version(name)
        if version is not None:
            return version
    return None


def _smi(query: tuple[str, ...]) -> list[str] | None:
    """The lines ``nvidia-smi`` prints for ``query``; None when it is absent or fails."""
    from trtspec.build.executor import nvidia_smi

    return nvidia_smi(query)


def probe_gpus() -> list[Gpu] | None:
    """GPUs from ``nvidia-smi`` (memory.total is in MiB); None when it is absent."""
    lines = _smi(NVIDIA_SMI_QUERY)
    if lines is None:
        return None
    gpus = []
    for line in lines:
        name, _, mib = line.rpartition(",")
        if name and mib.strip().isdigit():
            gpus.append(Gpu(name.strip(), int(mib.strip()) << 20))
    return gpus


def probe_build_gpu() -> dict[str, str] | None:
    """The GPU engines built here would be recorded for (``build.executor.build_gpu``)."""
    from trtspec.build.executor import build_gpu

    return build_gpu()


def probe_which(command: str) -> str | None:
    return shutil.which(command)


def probe_tritonserver() -> str | None:
    from trtspec.serve.discovery import OPT_BIN, pytriton_server_dir

    found = shutil.which("tritonserver")
    if found:
        return found
    if (OPT_BIN / "tritonserver").is_file():
        return str(OPT_BIN / "tritonserver")
    wheel = pytriton_server_dir()
    return str(wheel / "bin" / "tritonserver") if wheel is not None else None


def probe_backend() -> bool:
    return (BACKEND_DIR / BACKEND_LIBRARY).is_file()


def probe_shm() -> int | None:
    try:
        st = os.statvfs(SHM)
    except OSError:
        return None
    return st.f_blocks * st.f_frsize


def probe_exists(path: str) -> bool:
    return Path(path).is_file()


# ---------------------------------------------------------------- checks
def _major_minor(version: str) -> tuple[str, ...]:
    return tuple(version.split(".")[:2])


def _trtllm(spec: Any, gpu_spec: bool) -> Check:
    installed = probe_trtllm_version()
    if spec is not None and not gpu_spec:
        return Check("tensorrt_llm", SKIPPED, "reference backend: not needed")
    if installed is None:
        if spec is None:
            return Check(
                "tensorrt_llm",
                NOT_AVAILABLE,
                "not installed",
                "run inside the Triton TRT-LLM container to build GPU engines",
            )
        return Check(
            "tensorrt_llm",
            BLOCKER,
            "not installed",
            f"run inside {spec.stack.triton_image} (TensorRT-LLM {spec.stack.trtllm_version})",
        )
    if spec is None:
        return Check("tensorrt_llm", OK, f"{installed} installed")
    pin = str(spec.stack.trtllm_version)
    if installed == pin:
        return Check("tensorrt_llm", OK, f"{installed} installed, the spec pins {pin}")
    if _major_minor(installed) == _major_minor(pin):
        return Check(
            "tensorrt_llm",
            WARN,
            f"{installed} installed, the spec pins {pin}",
            f'set stack.trtllm_version: "{installed}" so the build cache '
            "records what really built the engines",
        )
    return Check(
        "tensorrt_llm",
        BLOCKER,
        f"{installed} installed, the spec pins {pin}",
        f"use {spec.stack.triton_image}, or set stack.trtllm_version to "
        f'"{installed}" (flags and tensors differ between versions)',
    )


def _scripts(plan: Any) -> list[str]:
    """The Python scripts the plan runs by path (convert_checkpoint.py, quantize.py)."""
    seen: dict[str, None] = {}
    for step in plan.steps:
        for arg in step.argv[1:2]:
            if arg.endswith(".py") and os.path.isabs(arg):
                seen.setdefault(arg, None)
    return list(seen)


def _build_tools(spec: Any, plan: Any) -> Iterable[Check]:
    if probe_which("trtllm-build"):
        yield Check("trtllm-build", OK, str(probe_which("trtllm-build")))
    else:
        yield Check(
            "trtllm-build",
            BLOCKER,
            "not on PATH",
            f"run inside {spec.stack.triton_image}, or put trtllm-build on PATH",
        )
    scripts = _scripts(plan)
    missing = [s for s in scripts if not probe_exists(s)]
    if not scripts:
        yield Check("examples scripts", SKIPPED, "the plan runs none")
    elif not missing:
        folder = os.path.commonpath([os.path.dirname(s) for s in scripts])
        yield Check("examples scripts", OK, f"{len(scripts)} found under {folder}")
    else:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        yield Check(
            "examples scripts",
            BLOCKER,
            f"missing: {missing[0]}{more}",
            "point stack.examples_dir (or --examples-dir) at the TensorRT-LLM "
            f"examples folder of version {spec.stack.trtllm_version}",
        )


def _gpu_checks(spec: Any, plan: Any, gpu_spec: bool) -> Iterable[Check]:
    gpus = probe_gpus()
    need = int(spec.target.tp) * int(spec.target.pp) if spec is not None else 1
    what = "TP×PP"
    # each instance on GPUs of its own (trtspec.plan.placement)
    if spec is not None and plan is not None and plan.gpus > need:
        need, what = plan.gpus, "TP×PP × instances"
    if gpus is None:
        yield Check(
            "GPUs",
            NOT_AVAILABLE,
            "nvidia-smi not found or failed",
            "run inside the container with `--gpus all`" if gpu_spec else "",
        )
        if gpu_spec:
            yield Check(
                "GPU memory",
                NOT_AVAILABLE,
                "no GPU to measure",
                "rerun doctor where the GPUs are visible",
            )
        return
    names = ", ".join(sorted({g.name for g in gpus})) or "none"
    if len(gpus) < need:
        yield Check(
            "GPUs",
            BLOCKER,
            f"{len(gpus)} ({names}), the spec needs {what} = {need}",
            "give the container more GPUs (`--gpus all`) or lower target.tp / target.pp"
            + (" / target.instances" if what != "TP×PP" else ""),
        )
    else:
        yield Check(
            "GPUs",
            OK,
            f"{len(gpus)} ({names})"
            + (f", the spec needs {what} = {need}" if spec is not None else ""),
        )
    if not gpu_spec or not gpus:
        return
    smallest = min(g.memory_bytes for g in gpus)
    from trtspec.flows import flow_for

    mp = flow_for(spec).memory_plan(spec, plan, smallest)
    if not mp.known:
        yield Check(
            "GPU memory",
            NOT_AVAILABLE,
            f"{gib(smallest)} per GPU; model config.json not on this machine yet",
            "rerun doctor after the download steps (`trtspec build --only VARIANT`)",
        )
        return
    repo, alone = mp.fits[0], mp.fits[1:]
    detail = (
        f"{gib(smallest)} per GPU; the repository needs at least {gib(repo.need_min)}, "
        f"{gib(repo.need_full)} for a full KV cache"
    )
    if repo.verdict == "fits":
        yield Check("GPU memory", OK, detail)
    elif any(f.verdict == "does not fit" for f in alone):
        yield Check("GPU memory", BLOCKER, detail, "; ".join(mp.warnings()))
    else:
        yield Check("GPU memory", WARN, detail, "; ".join(mp.warnings()))


def _serving(spec: Any, gpu_spec: bool) -> Iterable[Check]:
    server = probe_tritonserver()
    if server:
        yield Check("tritonserver", OK, server)
    else:
        yield Check(
            "tritonserver",
            BLOCKER if gpu_spec else WARN,
            "not found",
            "run inside the Triton TRT-LLM container, or `pip install nvidia-pytriton` "
            "for the CPU reference backend",
        )
    if spec is not None and spec.flow.llm_api:
        yield from _llmapi_model(gpu_spec)
    elif probe_backend():
        yield Check("tensorrtllm backend", OK, str(BACKEND_DIR))
    elif gpu_spec:
        yield Check(
            "tensorrtllm backend",
            BLOCKER,
            f"{BACKEND_DIR / BACKEND_LIBRARY} missing",
            f"serve inside {spec.stack.triton_image} (a -trtllm-python-py3 image)",
        )
    else:
        yield Check(
            "tensorrtllm backend",
            NOT_AVAILABLE,
            f"{BACKEND_DIR} missing",
            "" if spec is not None else "only the reference backend can serve here",
        )
    shm = probe_shm()
    if shm is None:
        yield Check("/dev/shm", NOT_AVAILABLE, f"cannot read {SHM}")
    elif shm < SHM_RECOMMENDED:
        yield Check(
            "/dev/shm",
            WARN,
            f"{gib(shm)}, below {gib(SHM_RECOMMENDED)}",
            "start the container with `--shm-size=2g` (Python models pass tensors through it)",
        )
    else:
        yield Check("/dev/shm", OK, gib(shm))


def _llmapi_model(gpu_spec: bool) -> Iterable[Check]:
    """The LLM-API flow serves upstream's Triton llmapi model, which ``trtspec
    repo`` copies from ``TRTLLM_LLMAPI_MODEL_DIR`` (or its default, a path no
    container is known to hold): present here, or the repository cannot be
    written on this machine."""
    from trtspec.flows.llmapi_repo import UPSTREAM_DEFAULT, UPSTREAM_ENV, UPSTREAM_FILES

    folder = Path(os.environ.get(UPSTREAM_ENV, UPSTREAM_DEFAULT))
    missing = [f for f in UPSTREAM_FILES if not probe_exists(str(folder / f))]
    if not missing:
        yield Check("llmapi model", OK, str(folder))
        return
    yield Check(
        "llmapi model",
        BLOCKER if gpu_spec else NOT_AVAILABLE,
        f"{folder}: {', '.join(missing)} missing"
        + ("" if UPSTREAM_ENV in os.environ else f" ({UPSTREAM_ENV} unset: the default)"),
        f"set {UPSTREAM_ENV} to triton_backend/all_models/llmapi/tensorrt_llm/1 of a "
        "TensorRT-LLM checkout at the pinned version's tag"
        if gpu_spec
        else "",
    )


def run_checks(spec: Any = None, plan: Any = None) -> list[Check]:
    """Every check, in order; ``spec``/``plan`` None checks the machine only."""
    gpu_spec = spec is not None and spec.backend.gpu
    checks = [_trtllm(spec, gpu_spec)]
    if gpu_spec:
        checks += list(_build_tools(spec, plan))
    checks += list(_gpu_checks(spec, plan, gpu_spec))
    checks += list(_serving(spec, gpu_spec))
    return checks


def blockers(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.status == BLOCKER]


def to_dict(checks: list[Check]) -> list[dict[str, str]]:
    return [asdict(c) for c in checks]
