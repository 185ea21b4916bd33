"""Runs a build plan: the one subprocess chokepoint (``run_subprocess``), the
staging folders that make every output appear atomically, the cache that
skips unchanged work, and the ``trtspec.json`` manifests.

Each *unit* (an engine folder, a converted checkpoint, a downloaded source) is
built in ``engines/<spec>/.staging/<unit>.<pid>/``: step argv that name the
unit's final folder are pointed at the staging folder, the log streams to
``build.log`` inside it, the manifest is written last, and only then is the
folder renamed into place. A killed build therefore leaves only a staging
folder, which no later step reads and the next run deletes. A unit whose
manifest lists the same step cache keys, and whose files still match the
sizes and hashes the manifest records (``trtspec.integrity``), is skipped. The executor takes a
backend object (``TrtllmBackend`` or ``ReferenceBackend``) for the parts that
differ — preflight checks, the Python that runs ``python`` steps, tool
versions — and a ``runner`` hook so tests can observe or replace the
subprocess call.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from trtspec import __version__
from trtspec.artifacts.engine_manifest import MANIFEST
from trtspec.artifacts.engine_manifest import SCHEMA_VERSION as MANIFEST_SCHEMA_VERSION
from trtspec.build.inspect import summarize_config
from trtspec.errors import StepFailed, TrtspecError
from trtspec.fsutil import atomic_write_json
from trtspec.integrity import describe, file_records, verify_files
from trtspec.plan import Plan, Step
from trtspec.procutil import dist_version, parent_death_hook, pid_alive
from trtspec.vocab import Backend, gpu_backend

#: runtime/engine/shared_weights.FOLDER (not imported: the build does not load the engine package)
SHARED_WEIGHTS = ".shared-weights"

LOG = "build.log"
TAIL_LINES = 30

Runner = Callable[[Sequence[str], "str | None", "Mapping[str, str] | None", Path], None]
Progress = Callable[[str], None]


# strerror(ENOSPC) as every tool prints it (Python's OSError, C's perror).
_DISK_FULL = os.strerror(errno.ENOSPC)


def run_subprocess(
    argv: Sequence[str],
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    log: Path | None = None,
    echo: Progress | None = None,
) -> None:
    """Run ``argv`` (a list, never a shell string), streaming output to ``log``.

    Raises ``StepFailed`` with the quoted command and the last lines of output.
    """
    argv = [str(a) for a in argv]
    command = shlex.join(argv)
    full_env = {**os.environ, **(env or {})}
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    log_file = open(log, "a", encoding="utf-8") if log else None  # noqa: SIM115
    try:
        if log_file:
            log_file.write(f"$ {command}\n")
            log_file.flush()
        try:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=full_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                bufsize=1,
                # PR_SET_PDEATHSIG: a SIGKILLed trtspec must not leave trtllm-build
                # writing into a staging folder nobody owns any more.
                preexec_fn=parent_death_hook(signal.SIGKILL),  # noqa: PLW1509
            )
        except FileNotFoundError:
            raise StepFailed(
                f"cannot run {argv[0]!r}: command not found ({command})",
                f"run trtspec build inside the Triton TRT-LLM container, or put {argv[0]} on PATH",
            ) from None
        with proc:
            try:
                assert proc.stdout is not None
                for line in proc.stdout:
                    tail.append(line.rstrip("\n"))
                    if log_file:
                        log_file.write(line)
                        log_file.flush()
                    if echo:
                        echo(line.rstrip("\n"))
                code = proc.wait()
            except BaseException:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                raise
    finally:
        if log_file:
            log_file.close()
    if code != 0:
        if any(_DISK_FULL in line for line in tail):
            # The tool's own traceback says nothing the user can act on.
            raise StepFailed(
                f"command failed with exit code {code}: no space left on the device "
                f"(the tool said {_DISK_FULL!r}): {command}",
                "free space on the disk of the engines folder (see `df -h`) or build "
                "elsewhere (--engines-dir); units built before are complete",
            )
        shown = "\n".join(f"    {t}" for t in tail) or "    (no output)"
        raise StepFailed(
            f"command failed with exit code {code}: {command}\n  last output:\n{shown}"
        )


# ----------------------------------------------------------------- backends


class BuildBackend(Protocol):
    name: str
    gpu: bool  # builds TensorRT-LLM engines for GPUs (Backend.gpu)

    def preflight(self, plan: Plan, steps: list[Step]) -> None: ...

    def resolve_argv(self, argv: Sequence[str]) -> list[str]: ...

    def versions(self) -> dict[str, str]: ...


def _python_argv(argv: Sequence[str]) -> list[str]:
    # Plans say "python" so dry runs stay readable; the step runs under the
    # interpreter running trtspec, which is the one that has trtspec installed.
    out = list(argv)
    if out and out[0] == "python":
        out[0] = sys.executable
    return out


@dataclass
class TrtllmBackend:
    """GPU engines: convert_checkpoint.py / quantize.py / trtllm-build in the container."""

    name: str = Backend.tensorrt_llm.value
    gpu: bool = True

    def preflight(self, plan: Plan, steps: list[Step]) -> None:
        if any(s.kind == "build" for s in steps) and shutil.which("trtllm-build") is None:
            raise TrtspecError(
                "trtllm-build is not on PATH; TensorRT-LLM engines can only be built where "
                "TensorRT-LLM is installed",
                "run inside the Triton TRT-LLM container (see stack.triton_image), use "
                "`trtspec build --dry-run` to see the commands, or set backend: reference",
            )
        for s in steps:
            if s.kind in ("convert", "quantize") and not Path(s.argv[1]).is_file():
                raise TrtspecError(
                    f"{s.argv[1]} does not exist (needed by step {s.id})",
                    "set stack.examples_dir (or --examples-dir) to the TensorRT-LLM examples "
                    "folder of the pinned version",
                )

    def resolve_argv(self, argv: Sequence[str]) -> list[str]:
        return _python_argv(argv)

    def versions(self) -> dict[str, str]:
        return {"trtspec": __version__, "tensorrt_llm": dist_version("tensorrt_llm") or "absent"}


@dataclass
class ReferenceBackend:
    """CPU engines written by ``python -m trtspec.build.reference``."""

    name: str = Backend.reference.value
    gpu: bool = False

    def preflight(self, plan: Plan, steps: list[Step]) -> None:
        if any(s.kind == "reference" for s in steps) and (
            importlib.util.find_spec("trtspec.build.reference") is None
        ):
            raise TrtspecError(
                "trtspec.build.reference is missing from this installation",
                "reinstall trtspec with the cpu extra: pip install -e '.[cpu]'",
            )

    def resolve_argv(self, argv: Sequence[str]) -> list[str]:
        return _python_argv(argv)

    def versions(self) -> dict[str, str]:
        return {
            "trtspec": __version__,
            "torch": dist_version("torch") or "absent",
            "transformers": dist_version("transformers") or "absent",
        }


def backend_for(name: str) -> BuildBackend:
    """The build backend of a plan's ``backend`` (``trtspec.vocab.Backend``)."""
    return TrtllmBackend() if gpu_backend(name) else ReferenceBackend()


# ---------------------------------------------------------------- execution


@dataclass
class StepOutcome:
    step: Step
    status: str  # ran | cached
    seconds: float = 0.0


@dataclass
class BuildResult:
    outcomes: list[StepOutcome] = field(default_factory=list)

    @property
    def ran(self) -> list[Step]:
        return [o.step for o in self.outcomes if o.status == "ran"]


def read_manifest(folder: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def cache_state(plan: Plan, unit: str) -> tuple[bool, list[str]]:
    """Whether ``unit`` was fully built from exactly these steps and its files
    still match its manifest, and the file problems when only they differ.
    A manifest that records no files (older trtspec) counts as cached."""
    manifest = read_manifest(Path(unit))
    if manifest is None:
        return False, []
    keys = [s.get("cache_key") for s in manifest.get("steps", []) if isinstance(s, dict)]
    if keys != [s.cache_key for s in plan.unit_steps(unit)]:
        return False, []
    problems = verify_files(Path(unit), manifest)
    return not problems, describe(problems or [])


def is_cached(plan: Plan, unit: str) -> bool:
    """True when ``unit`` was fully built from exactly these steps and is intact."""
    return cache_state(plan, unit)[0]


def selected_units(plan: Plan, only: str | None = None) -> list[str]:
    if only is None:
        return plan.units()
    if only not in plan.variants:
        raise KeyError(only)
    wanted = plan.units_for(only)
    return [u for u in plan.units() if u in wanted]


def plan_status(
    plan: Plan, *, force: bool = False, only: str | None = None
) -> list[tuple[Step, bool]]:
    """Each selected step with whether it would be skipped as cached."""
    out = []
    for unit in selected_units(plan, only):
        cached = not force and is_cached(plan, unit)
        out += [(s, cached) for s in plan.unit_steps(unit)]
    return out


def _staging_name(plan: Plan, unit: str) -> str:
    rel = Path(unit).relative_to(plan.root) if Path(unit).is_relative_to(plan.root) else Path(unit)
    return "__".join(rel.parts)


def _restage(arg: str, unit: str, staging: Path) -> str:
    if arg == unit:
        return str(staging)
    if arg.startswith(unit + "/"):
        return str(staging) + arg[len(unit) :]
    return arg


def clean_stale_staging(root: Path) -> list[Path]:
    """Delete staging folders left by builds that died (their pid is gone)."""
    removed: list[Path] = []
    staging = root / ".staging"
    if not staging.is_dir():
        return removed
    for entry in staging.iterdir():
        suffix = entry.name.rsplit(".", 1)[-1]
        if suffix.isdigit() and int(suffix) != os.getpid() and pid_alive(int(suffix)):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


@contextlib.contextmanager
def _build_lock(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".build.lock", "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise TrtspecError(
                f"another trtspec build is writing {root}", "wait for it to finish, or stop it"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


BLOBS = ".blobs"
#: files this large are stored once per spec's engine folder (``share_identical``)
SHARE_MIN_BYTES = 64 * 1024 * 1024


def share_identical(staging: Path, root: Path) -> int:
    """Store each large file of a just-built reference unit once per engine
    root: ``root/.blobs/<sha256>`` and every unit's copy are hard links of
    one file. The demo's four engines hold the same 513 MB
    ``hf/model.safetensors``: written, cached and read once instead of four
    times (a cold server start reads it from disk once; the engine stubs that
    map it share its pages). Returns the bytes saved. A file system without
    hard links keeps the copies. Nothing is ever written through a link: the
    units are replaced whole on a rebuild, and ``prune_blobs`` drops a blob
    no unit links any more."""
    import hashlib

    saved = 0
    blobs = root / BLOBS
    for path in sorted(p for p in staging.rglob("*") if p.is_file() and not p.is_symlink()):
        size = path.stat().st_size
        if size < SHARE_MIN_BYTES:
            continue
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 22):
                digest.update(chunk)
        blob = blobs / digest.hexdigest()
        tmp = path.with_name(f".{path.name}.link")
        try:
            blobs.mkdir(exist_ok=True)
            if blob.is_file() and blob.stat().st_size == size:
                os.link(blob, tmp)
                os.replace(tmp, path)
                saved += size
            else:
                os.link(path, blob)
        except OSError:  # no hard links here: the unit keeps its own copy
            with contextlib.suppress(OSError):
                tmp.unlink()
    return saved


def prune_blobs(root: Path) -> None:
    """Remove the blobs no unit links any more (a link count of 1)."""
    blobs = root / BLOBS
    if not blobs.is_dir():
        return
    for blob in blobs.iterdir():
        with contextlib.suppress(OSError):
            if blob.stat().st_nlink <= 1:
                blob.unlink()


def _replace_dir(staging: Path, final: Path, trash: Path) -> None:
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():
        os.replace(final, trash)
    os.replace(staging, final)
    shutil.rmtree(trash, ignore_errors=True)


BUILD_GPU_QUERY = ("--query-gpu=name,compute_cap", "--format=csv,noheader")


def nvidia_smi(query: tuple[str, ...]) -> list[str] | None:
    """The lines ``nvidia-smi`` prints for ``query``; None when it is absent or
    fails. Here, beside the chokepoint, so ``build`` and ``doctor`` share it
    without importing each other."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return None
    lines: list[str] = []
    try:
        run_subprocess([binary, *query], echo=lines.append)
    except StepFailed:
        return None
    return lines


def build_gpu() -> dict[str, str] | None:
    """The name and CUDA compute capability of this machine's first GPU: what
    the engines built here run on (TensorRT engines are specific to it, and
    ``trtspec deploy`` schedules them on nodes with that capability). None
    without ``nvidia-smi``."""
    for line in nvidia_smi(BUILD_GPU_QUERY) or []:
        name, _, cap = line.rpartition(",")
        if name.strip() and cap.strip():
            return {"name": name.strip(), "compute_capability": cap.strip()}
    return None


def _manifest(
    plan: Plan, unit: str, records: list[dict[str, Any]], backend: BuildBackend, staging: Path
) -> dict[str, Any]:
    engine = next((e for e in plan.engines if str(e.dir) == unit), None)
    summary = None
    if (staging / "config.json").is_file():
        with contextlib.suppress(ValueError, OSError):
            summary = summarize_config(json.loads((staging / "config.json").read_text()))
    return {
        "schema_version": MANIFEST_SCHEMA_VERSION,
        "spec": plan.spec_name,
        "spec_hash": plan.spec_hash,
        "backend": plan.backend,
        "unit": unit,
        "engine": engine.to_dict() if engine else None,
        "steps": records,
        "versions": backend.versions(),
        "gpu": build_gpu() if backend.gpu else None,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config_summary": summary,
        "files": file_records(staging),
    }


def execute(
    plan: Plan,
    *,
    backend: BuildBackend | None = None,
    force: bool = False,
    only: str | None = None,
    runner: Runner | None = None,
    progress: Progress | None = None,
) -> BuildResult:
    """Build every selected unit whose cache key changed; see the module docstring."""
    backend = backend or backend_for(plan.backend)
    run = runner or run_subprocess
    say = progress or (lambda _msg: None)
    units = selected_units(plan, only)
    todo = []
    for unit in units:
        cached, problems = (False, []) if force else cache_state(plan, unit)
        if problems:
            shown = "; ".join(problems[:3]) + ("; …" if len(problems) > 3 else "")
            say(f"{unit}: files differ from its {MANIFEST} ({shown}); rebuilding")
        if not cached:
            todo.append(unit)
    backend.preflight(plan, [s for u in todo for s in plan.unit_steps(u)])
    result = BuildResult()
    total = sum(len(plan.unit_steps(u)) for u in units)
    n = 0
    with _build_lock(plan.root):
        clean_stale_staging(plan.root)
        for unit in units:
            steps = plan.unit_steps(unit)
            if unit not in todo:
                for s in steps:
                    n += 1
                    say(f"[{n}/{total}] {s.description}: cached")
                    result.outcomes.append(StepOutcome(s, "cached"))
                continue
            name = _staging_name(plan, unit)
            staging = plan.root / ".staging" / f"{name}.{os.getpid()}"
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            log = staging / LOG
            records = []
            for s in steps:
                n += 1
                say(f"[{n}/{total}] {s.description} ...")
                argv = backend.resolve_argv([_restage(a, unit, staging) for a in s.argv])
                started = time.monotonic()
                try:
                    run(argv, s.cwd, s.env or None, log)
                except StepFailed as exc:
                    kept = plan.root / ".logs" / f"{name}.{LOG}"
                    kept.parent.mkdir(parents=True, exist_ok=True)
                    if log.is_file():
                        shutil.copy2(log, kept)
                    shutil.rmtree(staging, ignore_errors=True)
                    hint = f"{exc.hint}; full log: {kept}" if exc.hint else f"full log: {kept}"
                    raise StepFailed(f"step {s.id} failed: {exc.message}", hint) from None
                except BaseException:
                    shutil.rmtree(staging, ignore_errors=True)
                    raise
                seconds = time.monotonic() - started
                say(f"[{n}/{total}] {s.description}: done in {seconds:.1f}s")
                records.append(
                    {
                        "id": s.id,
                        "kind": s.kind,
                        "argv": list(s.argv),
                        "cache_key": s.cache_key,
                        "seconds": round(seconds, 3),
                    }
                )
                result.outcomes.append(StepOutcome(s, "ran", seconds))
            if not gpu_backend(plan.backend):  # reference engines share identical files
                share_identical(staging, plan.root)
            atomic_write_json(staging / MANIFEST, _manifest(plan, unit, records, backend, staging))
            trash = plan.root / ".staging" / f"{name}.old.{os.getpid()}"
            _replace_dir(staging, Path(unit), trash)
        # Rebuilt weights make the packed copies engines share stale
        # (runtime/engine/shared_weights.py); a running server keeps its mapping.
        for folder in {Path(unit).parent / SHARED_WEIGHTS for unit in todo}:
            shutil.rmtree(folder, ignore_errors=True)
        if todo:
            prune_blobs(plan.root)
    return result
