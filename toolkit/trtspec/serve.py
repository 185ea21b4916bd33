"""The tritonserver supervisor: one way to find, start, watch and stop Triton.

This module owns everything between a model repository on disk and a ready
server: locating a ``tritonserver`` binary (explicit path › ``PATH`` ›
``/opt/tritonserver/bin`` › the binary bundled in the ``nvidia-pytriton`` wheel,
which on a CPU machine needs an assembled backend folder, ``LD_LIBRARY_PATH``
and ``PYTHONPATH``), building its argv (free ports, 127.0.0.1 unless told
otherwise, explicit model loading for one variant's closure read from
``trtspec-repo.json``, the ``mpirun`` leader-mode command for TP×PP > 1),
starting it in its own process group with its log in a file, waiting for
``/v2/health/ready`` with a deadline, and tearing it down with SIGTERM then
SIGKILL so no server or Python-backend stub outlives it. The CLI, the
benchmark and the tests all use this one ``Server``.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import site
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import trtspec
from trtspec.errors import ServerError

OPT_BIN = Path("/opt/tritonserver/bin")
MANIFEST_NAME = "trtspec-repo.json"
MANIFEST_SCHEMA_VERSION = 1
_STUB_NAME = "triton_python_backend_stub"
_UTILS_NAME = "triton_python_backend_utils.py"
_PATH_HOOK = "_trtspec_stub_path"
# The wheel's stub embeds Python in isolated mode, so it ignores PYTHONPATH; the
# stub imports triton_python_backend_utils (from the backend folder) before any
# model.py, so our copy of it first applies PYTHONPATH, .pth files included (an
# editable install's lives there), ahead of the base interpreter's site-packages.
_PATH_HOOK_SOURCE = """\
\"\"\"Written by trtspec: apply PYTHONPATH, which the isolated stub ignores.\"\"\"
import os
import site
import sys

_entries = [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]
for _entry in reversed(_entries):
    if _entry in sys.path:
        sys.path.remove(_entry)
    sys.path.insert(0, _entry)
for _entry in _entries:
    site.addsitedir(_entry)
"""
# Log lines Triton prints on every CPU-only start; they are not the reason a start failed.
_BENIGN_ERRORS = (
    "CudaDriverHelper has not been initialized",
    "Failed to initialize NVML",
)
_ERROR_LINE = re.compile(r"^E\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [^\]]+\] ?(.*)$")


# ---------------------------------------------------------------------------
# Finding tritonserver


@dataclass(frozen=True)
class TritonInstall:
    """A runnable tritonserver: the binary, the ``--backend-directory`` to pass
    (``None``: the binary's built-in default) and the environment variables it
    needs on top of ``os.environ``. ``source`` says where it was found."""

    binary: Path
    backend_dir: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    source: str = "explicit"


def cache_root() -> Path:
    """Where trtspec keeps machine-local derived files (``TRTSPEC_CACHE_DIR``,
    else ``$XDG_CACHE_HOME/trtspec``, else ``~/.cache/trtspec``)."""
    explicit = os.environ.get("TRTSPEC_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "trtspec"


def pytriton_server_dir() -> Path | None:
    """The ``pytriton/tritonserver`` folder of the installed nvidia-pytriton
    wheel, found without importing pytriton (its import is slow)."""
    try:
        spec = importlib.util.find_spec("pytriton")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "tritonserver"
        if (candidate / "bin" / "tritonserver").is_file():
            return candidate
    return None


def _wheel_root_of(binary: Path) -> Path | None:
    """The wheel's ``tritonserver`` folder when ``binary`` is the wheel's bundled
    server (recognised by its layout, so an explicit path to it works too)."""
    root = binary.resolve().parent.parent
    if (root / "python_backend_stubs").is_dir() and (
        root / "backends" / "python" / "libtriton_python.so"
    ).is_file():
        return root
    return None


def find_tritonserver(
    explicit: str | os.PathLike[str] | None = None,
    *,
    search_path: str | None = None,
    opt_dir: Path = OPT_BIN,
    wheel_dir: Path | bool | None = True,
    cache_dir: Path | None = None,
) -> TritonInstall:
    """Locate tritonserver: ``explicit`` › ``PATH`` › ``opt_dir`` › the
    nvidia-pytriton wheel. ``search_path`` replaces ``$PATH`` and ``wheel_dir``
    the wheel's folder (``True``: look it up, ``None``/``False``: skip); both
    exist for tests. Raises ``ServerError`` naming what was tried."""
    if explicit is not None:
        binary = Path(explicit).expanduser()
        if not binary.is_file():
            raise ServerError(
                f"tritonserver binary not found: {binary}",
                hint="pass the path of an executable tritonserver, or leave it out to "
                "search PATH, /opt/tritonserver/bin and the nvidia-pytriton wheel",
            )
        if not os.access(binary, os.X_OK):
            raise ServerError(
                f"tritonserver binary is not executable: {binary}",
                hint=f"chmod +x {binary}",
            )
        return _install_for(binary.absolute(), "explicit", cache_dir)
    on_path = shutil.which("tritonserver", path=search_path)
    if on_path:
        return _install_for(Path(on_path).absolute(), "PATH", cache_dir)
    opt_binary = opt_dir / "tritonserver"
    if opt_binary.is_file() and os.access(opt_binary, os.X_OK):
        return _install_for(opt_binary, str(opt_dir), cache_dir)
    root = pytriton_server_dir() if wheel_dir is True else (wheel_dir or None)
    if root is not None and (root / "bin" / "tritonserver").is_file():
        return _install_for(root / "bin" / "tritonserver", "nvidia-pytriton", cache_dir)
    raise ServerError(
        f"tritonserver not found on PATH, in {opt_dir} or in the nvidia-pytriton wheel",
        hint="run inside the Triton TRT-LLM container, `pip install nvidia-pytriton` "
        "(bundles a CPU-capable tritonserver), or pass the binary with --tritonserver",
    )


def _install_for(binary: Path, source: str, cache_dir: Path | None) -> TritonInstall:
    root = _wheel_root_of(binary)
    if root is None:
        env = {}
        package_parent = _trtspec_import_dir()
        # The stub of a foreign install runs its own Python; give it trtspec only
        # when trtspec is not sitting inside this interpreter's site-packages,
        # whose compiled packages would not match that Python.
        if package_parent.name not in ("site-packages", "dist-packages"):
            env["PYTHONPATH"] = _join_paths([str(package_parent)], "PYTHONPATH")
        return TritonInstall(binary=binary, backend_dir=None, env=env, source=source)
    backend_dir = prepare_backend_dir(root, cache_dir or cache_root())
    return TritonInstall(
        binary=binary, backend_dir=backend_dir, env=wheel_env(root), source=source
    )


def _trtspec_import_dir() -> Path:
    return Path(trtspec.__file__).resolve().parent.parent


def _join_paths(first: Iterable[str], variable: str) -> str:
    """``first`` (deduplicated, order kept) followed by the current value of
    ``variable``, so a user's own setting still applies after ours."""
    parts: list[str] = []
    for entry in [*first, *os.environ.get(variable, "").split(os.pathsep)]:
        if entry and entry not in parts:
            parts.append(entry)
    return os.pathsep.join(parts)


def _libpython_dir() -> Path:
    libdir = sysconfig.get_config_var("LIBDIR")
    soname = sysconfig.get_config_var("INSTSONAME") or sysconfig.get_config_var("LDLIBRARY")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    if not libdir or not soname or not (Path(libdir) / soname).is_file():
        raise ServerError(
            f"Python {version} at {sys.executable} has no shared libpython "
            f"({soname or 'libpython'} not in {libdir}); the Python backend stub links against it",
            hint="use a Python built with --enable-shared (distribution or python.org builds; "
            "pyenv with PYTHON_CONFIGURE_OPTS=--enable-shared)",
        )
    return Path(libdir)


def wheel_env(root: Path) -> dict[str, str]:
    """Environment for the wheel's tritonserver and its stubs. The running
    interpreter's libpython comes first because the stub links ``libpythonX.Y``
    and a system copy of another patch release may otherwise win; the wheel's
    vendored libraries come next. ``PYTHONPATH`` carries this venv's
    site-packages and the folder holding ``trtspec`` because an editable
    install's ``.pth`` file is not read for ``PYTHONPATH`` entries."""
    site_dirs = [str(root.parent.parent)]
    site_dirs += [d for d in site.getsitepackages() if Path(d).is_dir()]
    return {
        "LD_LIBRARY_PATH": _join_paths(
            [str(_libpython_dir()), str(root.parent.parent / "nvidia_pytriton.libs")],
            "LD_LIBRARY_PATH",
        ),
        "PYTHONPATH": _join_paths([str(_trtspec_import_dir()), *site_dirs], "PYTHONPATH"),
    }


def prepare_backend_dir(root: Path, cache: Path) -> Path:
    """Assemble ``<cache>/triton-backends/pyX.Y-<digest>/python/`` from the
    wheel (the backend library and the stub built for the running Python) and
    return the folder to pass as ``--backend-directory``. Built in a temp dir
    and renamed into place, so concurrent callers and interrupted runs never
    see a half-copied folder; the digest changes when the wheel does."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / version / _STUB_NAME
    if not stub.is_file():
        stubs_dir = root / "python_backend_stubs"
        have = sorted(p.name for p in stubs_dir.iterdir() if (p / _STUB_NAME).is_file())
        raise ServerError(
            f"the nvidia-pytriton wheel at {root} has no Python backend stub for Python "
            f"{version} (it has: {', '.join(have) or 'none'})",
            hint="run trtspec from a Python version the wheel supports, or use another "
            "tritonserver with --tritonserver",
        )
    library = root / "backends" / "python" / "libtriton_python.so"
    utils = root / "backends" / "python" / _UTILS_NAME
    digest = hashlib.sha256(_PATH_HOOK_SOURCE.encode())
    for source in (library, utils, stub):
        stat = source.stat()
        digest.update(f"{source.resolve()}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
    final = cache / "triton-backends" / f"py{version}-{digest.hexdigest()[:16]}"
    if (final / "python" / _STUB_NAME).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=final.parent))
    try:
        target = staging / "python"
        target.mkdir()
        shutil.copy2(library, target / library.name)
        shutil.copy2(stub, target / stub.name)
        (target / f"{_PATH_HOOK}.py").write_text(_PATH_HOOK_SOURCE, encoding="utf-8")
        (target / _UTILS_NAME).write_text(
            f"import {_PATH_HOOK}  # noqa: F401  (added by trtspec, see that module)\n"
            + utils.read_text(encoding="utf-8"),
            encoding="utf-8",
        )
        try:
            os.rename(staging, final)
        except OSError:
            # Another process renamed its copy first; theirs is complete, use it.
            if not (final / "python" / _STUB_NAME).is_file():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return final


# ---------------------------------------------------------------------------
# Repository manifest: which models a variant needs


def read_manifest(repo: Path) -> dict:
    """Load ``trtspec-repo.json`` from ``repo`` with errors naming the file."""
    path = repo / MANIFEST_NAME
    if not path.is_file():
        raise ServerError(
            f"{path}: not found; --variant needs the manifest that `trtspec repo` writes",
            hint="serve the folder `trtspec repo` wrote, or leave out --variant to load all models",
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ServerError(
            f"{path}: not a readable JSON manifest: {exc}",
            hint="rewrite it with `trtspec repo`",
        ) from exc
    if not isinstance(data, dict) or not isinstance(data.get("models"), dict):
        raise ServerError(
            f"{path}: models: missing or not an object",
            hint="rewrite it with `trtspec repo`",
        )
    version = data.get("schema_version")
    if version != MANIFEST_SCHEMA_VERSION:
        raise ServerError(
            f"{path}: schema_version: {version!r} is not supported "
            f"(this trtspec reads {MANIFEST_SCHEMA_VERSION})",
            hint="rewrite it with this version of `trtspec repo`",
        )
    return data


def variant_models(repo: Path, variant: str) -> list[str]:
    """The models ``--variant`` must load: the variant's orchestrator and the
    closure of its ``calls`` in the manifest, sorted."""
    manifest = read_manifest(repo)
    path = repo / MANIFEST_NAME
    models: dict = manifest["models"]
    variants = [str(v) for v in manifest.get("variants") or []]
    orchestrators = [
        name
        for name, info in models.items()
        if isinstance(info, dict)
        and info.get("role") == "orchestrator"
        and (info.get("variant") or name) == variant
    ]
    if variant not in variants or not orchestrators:
        raise ServerError(
            f"{path}: unknown variant {variant!r}; valid variants: "
            f"{', '.join(variants) or '(none)'}",
            hint="pass one of the valid variants to --variant",
        )
    seen: set[str] = set()
    pending = list(orchestrators)
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        info = models.get(name)
        if not isinstance(info, dict):
            caller = next(
                (m for m in sorted(seen) if name in (models.get(m) or {}).get("calls", [])),
                variant,
            )
            raise ServerError(
                f"{path}: models.{caller}.calls: {name!r} is not a model in the manifest",
                hint="rewrite the manifest with `trtspec repo`",
            )
        pending.extend(str(callee) for callee in info.get("calls") or [])
    return sorted(seen)


def engine_models(repo: Path, among: Iterable[str] | None = None) -> list[str]:
    """Models with role ``engine`` in the manifest (optionally only ``among``)."""
    models = read_manifest(repo)["models"]
    wanted = set(among) if among is not None else None
    return sorted(
        name
        for name, info in models.items()
        if isinstance(info, dict)
        and info.get("role") == "engine"
        and (wanted is None or name in wanted)
    )


def detect_world_size(repo: Path) -> int:
    """TP×PP of the repository's TensorRT-LLM engines, read from each engine
    model's ``gpt_model_path``/``config.json``; 1 without a manifest or for
    reference engines."""
    if not (repo / MANIFEST_NAME).is_file():
        return 1
    if read_manifest(repo).get("backend") != "tensorrt_llm":
        return 1
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    sizes: set[int] = set()
    for name in engine_models(repo):
        config = model_config_pb2.ModelConfig()
        try:
            text = (repo / name / "config.pbtxt").read_text(encoding="utf-8")
            text_format.Parse(text, config)
            engine_dir = Path(config.parameters["gpt_model_path"].string_value)
            engine = json.loads((repo / engine_dir / "config.json").read_text(encoding="utf-8"))
            mapping = engine["pretrained_config"]["mapping"]
            size = mapping.get("world_size") or mapping.get("tp_size", 1) * mapping.get(
                "pp_size", 1
            )
        except (OSError, ValueError, KeyError, TypeError, text_format.ParseError):
            continue  # tritonserver itself reports a broken engine model precisely
        sizes.add(int(size))
    if len(sizes) > 1:
        raise ServerError(
            f"{repo}: engine models need different TP×PP world sizes ({sorted(sizes)}); "
            "one leader-mode launch runs one world size",
            hint="build every engine with the same tp and pp, or pass --world-size",
        )
    return sizes.pop() if sizes else 1


# ---------------------------------------------------------------------------
# Command lines


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports the OS says are free now (bind to port 0). The
    sockets stay bound until all are chosen so none is handed out twice."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sockets = [socket.socket(family, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def server_argv(
    binary: str | os.PathLike[str],
    repo: str | os.PathLike[str],
    *,
    host: str,
    http_port: int,
    grpc_port: int,
    metrics_port: int,
    backend_dir: str | os.PathLike[str] | None = None,
    models: Sequence[str] | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The argv of one tritonserver process (pure)."""
    argv = [str(binary), f"--model-repository={repo}"]
    if backend_dir is not None:
        argv.append(f"--backend-directory={backend_dir}")
    argv += [
        f"--http-address={host}",
        f"--http-port={http_port}",
        f"--grpc-address={host}",
        f"--grpc-port={grpc_port}",
        f"--metrics-address={host}",
        f"--metrics-port={metrics_port}",
    ]
    if models is not None:
        argv.append("--model-control-mode=explicit")
        argv += [f"--load-model={name}" for name in models]
    argv += list(extra_args)
    return argv


def leader_mode_argv(
    world_size: int,
    repo: str | os.PathLike[str],
    *,
    engine_model: str | Sequence[str],
    http_port: int = 8000,
    grpc_port: int = 8001,
    metrics_port: int = 8002,
    host: str = "127.0.0.1",
    binary: str | os.PathLike[str] = "tritonserver",
    mpirun: str = "mpirun",
    backend_dir: str | os.PathLike[str] | None = None,
    models: Sequence[str] | None = None,
    oversubscribe: bool = False,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The ``mpirun`` command for TP×PP = ``world_size`` in TRT-LLM's leader
    mode: one tritonserver per rank, each with its own Python-backend shared
    memory prefix. Ranks > 0 load only the engine model(s) explicitly; they
    block inside the engine's instance initialisation, so sharing the ports
    with rank 0 never clashes. ``models`` restricts rank 0 to those models."""
    if world_size < 2:
        raise ValueError("leader mode needs world_size >= 2")
    engines = [engine_model] if isinstance(engine_model, str) else list(engine_model)
    if not engines:
        raise ValueError("leader mode needs at least one engine model for ranks > 0")
    argv = [mpirun, "--allow-run-as-root"]
    if oversubscribe:
        argv.append("--oversubscribe")
    for rank in range(world_size):
        if rank:
            argv.append(":")
        argv += ["-n", "1"]
        argv += server_argv(
            binary, repo, host=host, http_port=http_port, grpc_port=grpc_port,
            metrics_port=metrics_port, backend_dir=backend_dir,
            models=models if rank == 0 else engines,
            extra_args=[
                "--disable-auto-complete-config",
                f"--backend-config=python,shm-region-prefix-name=prefix{rank}_",
                *extra_args,
            ],
        )  # fmt: skip
    return argv


def _connect_host(host: str) -> str:
    """The address a local client uses to reach a server bound to ``host``."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


# ---------------------------------------------------------------------------
# The supervisor

_LIVE: weakref.WeakSet[Server] = weakref.WeakSet()


@atexit.register
def _stop_live_servers() -> None:
    for server in list(_LIVE):
        server.stop(grace=5.0)


class Server:
    """One supervised tritonserver (or ``mpirun`` leader-mode launch).

    Ports given as 0 are picked free at ``start()``; ``models`` (a list) means
    ``--model-control-mode explicit`` with one ``--load-model`` each. Use as a
    context manager, or call ``start()`` and ``stop()``."""

    def __init__(
        self,
        repo: str | os.PathLike[str],
        *,
        binary: str | os.PathLike[str] | None = None,
        host: str = "127.0.0.1",
        http_port: int = 0,
        grpc_port: int = 0,
        metrics_port: int = 0,
        models: Sequence[str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        world_size: int = 1,
        engine_models: Sequence[str] = (),
        install: TritonInstall | None = None,
    ) -> None:
        self.repo = Path(repo).absolute()
        if not self.repo.is_dir():
            raise ServerError(
                f"model repository not found: {self.repo}",
                hint="pass the folder `trtspec repo` wrote (e.g. triton_repo/<spec>)",
            )
        self.install = install or find_tritonserver(binary)
        self.host = host
        self._requested = (http_port, grpc_port, metrics_port)
        self._ports: tuple[int, int, int] | None = None
        self.models = list(models) if models is not None else None
        self.extra_args = list(extra_args)
        self.env = dict(env or {})
        self.world_size = world_size
        self.engine_models = list(engine_models)
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="tritonserver-", suffix=".log")
            os.close(fd)
            log_path = name
        self.log_path = Path(log_path).absolute()
        self._process: subprocess.Popen[bytes] | None = None

    # -- addresses ---------------------------------------------------------
    def _port(self, index: int) -> int:
        if self._ports is None:
            raise ServerError("tritonserver has not been started", hint="call start() first")
        return self._ports[index]

    @property
    def http_port(self) -> int:
        return self._port(0)

    @property
    def grpc_port(self) -> int:
        return self._port(1)

    @property
    def metrics_port(self) -> int:
        return self._port(2)

    @property
    def http_url(self) -> str:
        return f"{_connect_host(self.host)}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{_connect_host(self.host)}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"{_connect_host(self.host)}:{self.metrics_port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def endpoints(self) -> dict[str, str]:
        """What a client needs, as plain data (the CLI prints this)."""
        return {
            "http": f"http://{self.http_url}",
            "grpc": self.grpc_url,
            "metrics": f"http://{self.metrics_url}/metrics",
            "log": str(self.log_path),
        }

    # -- command line ------------------------------------------------------
    def argv(self) -> list[str]:
        """The command ``start()`` runs, with the ports chosen so far."""
        if self._ports is None:
            self._ports = self._choose_ports()
        http_port, grpc_port, metrics_port = self._ports
        common = {
            "host": self.host, "http_port": http_port, "grpc_port": grpc_port,
            "metrics_port": metrics_port, "binary": self.install.binary,
            "backend_dir": self.install.backend_dir, "models": self.models,
            "extra_args": self.extra_args,
        }  # fmt: skip
        if self.world_size > 1:
            return leader_mode_argv(
                self.world_size, self.repo, engine_model=self.engine_models, **common
            )
        return server_argv(common.pop("binary"), self.repo, **common)

    def _choose_ports(self) -> tuple[int, int, int]:
        wanted = list(self._requested)
        picks = iter(free_ports(sum(1 for p in wanted if p == 0), self.host))
        chosen = [p if p else next(picks) for p in wanted]
        return chosen[0], chosen[1], chosen[2]

    # -- lifecycle ---------------------------------------------------------
    def start(self, timeout: float = 120.0) -> Server:
        """Launch and wait until ``/v2/health/ready`` answers 200. Raises
        ``ServerError`` with the log's errors and tail if the server exits
        first or is not ready within ``timeout`` seconds; nothing is left
        running then. Auto-picked ports that were taken meanwhile are re-picked
        (twice at most)."""
        if self.running:
            return self
        attempts = 3 if 0 in self._requested else 1
        for attempt in range(attempts):
            self._ports = None
            try:
                self._launch_and_wait(timeout)
                return self
            except _PortInUse as exc:
                if attempt == attempts - 1:
                    raise exc.error from None
            except BaseException:
                self.stop(grace=2.0)
                raise
        raise AssertionError("unreachable")

    def _launch_and_wait(self, timeout: float) -> None:
        argv = self.argv()
        env = {**os.environ, **self.install.env, **self.env}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            # Own session: the server and its stubs form one process group that
            # stop() can signal, and a terminal's Ctrl-C reaches only us.
            self._process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                # The child only calls prctl, resolved beforehand: no lock it could
                # inherit from another thread is taken.
                preexec_fn=_die_with_parent_hook(),  # noqa: PLW1509
            )
        _LIVE.add(self)
        deadline = time.monotonic() + timeout
        ready_url = f"http://{self.http_url}/v2/health/ready"
        delay = 0.05
        while True:
            code = self._process.poll()
            if code is not None:
                self.stop(grace=2.0)
                error = self._failure(f"tritonserver exited with code {code} before it was ready")
                if "already in use" in self.log_text() and 0 in self._requested:
                    raise _PortInUse(error)
                raise error
            if _http_status(ready_url, timeout=1.0) == 200:
                return
            if time.monotonic() >= deadline:
                self.stop(grace=2.0)
                raise self._failure(f"tritonserver was not ready after {timeout:g} s")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def _failure(self, headline: str) -> ServerError:
        text = self.log_text()
        errors = log_errors(text)
        parts = [headline]
        if errors:
            parts.append("errors in the log:\n  " + "\n  ".join(errors[:10]))
        # Triton's option tables fill a tail without saying anything about the failure.
        lines = [ln for ln in text.splitlines() if not ln.startswith(("|", "+"))]
        tail = "\n".join(lines[-15:])
        parts.append(f"log tail ({self.log_path}):\n{tail}" if tail else "the log is empty")
        return ServerError("\n".join(parts), hint=f"full log: {self.log_path}")

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def poll(self) -> int | None:
        """The exit code once the server has exited, else ``None``."""
        return None if self._process is None else self._process.poll()

    def check_alive(self) -> None:
        """Raise ``ServerError`` with the log tail if the server has exited."""
        code = self.poll()
        if self._process is not None and code is not None:
            self.stop(grace=1.0)
            raise self._failure(f"tritonserver exited unexpectedly with code {code}")

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM the server's process group, wait up to ``grace`` seconds,
        then SIGKILL whatever is left of it (stubs included). Idempotent;
        returns the server's exit code."""
        process = self._process
        if process is None:
            return None
        _LIVE.discard(self)
        pgid = process.pid  # start_new_session made the server a group leader
        if process.poll() is None:
            _signal_group(pgid, signal.SIGTERM)
            try:
                process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                _signal_group(pgid, signal.SIGKILL)
                process.wait()
        # A server that exited can leave stubs behind for a moment; none may outlive it.
        _signal_group(pgid, signal.SIGKILL)
        return process.returncode

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- logs and HTTP helpers ---------------------------------------------
    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, n: int = 40) -> str:
        """The last ``n`` lines of the server log."""
        lines = self.log_text().splitlines()
        return "\n".join(lines[-n:]) if n > 0 else ""

    def _post(self, path: str, what: str) -> None:
        url = f"http://{self.http_url}{path}"
        request = urllib.request.Request(url, data=b"{}", method="POST")
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=600):
                return
        except urllib.error.HTTPError as exc:
            body = exc.read().decode("utf-8", errors="replace")
            try:
                detail = json.loads(body).get("error", body)
            except (json.JSONDecodeError, AttributeError):
                detail = body
            raise ServerError(f"{what} failed: {detail}", hint=f"log: {self.log_path}") from exc
        except OSError as exc:
            raise ServerError(f"{what} failed: {exc}", hint=f"log: {self.log_path}") from exc

    def load_model(self, name: str) -> None:
        """Load (or reload) ``name`` through the repository API (explicit mode)."""
        self._post(f"/v2/repository/models/{name}/load", f"loading model {name!r}")

    def unload_model(self, name: str) -> None:
        """Unload ``name`` through the repository API (explicit mode)."""
        self._post(f"/v2/repository/models/{name}/unload", f"unloading model {name!r}")

    def model_ready(self, name: str) -> bool:
        return _http_status(f"http://{self.http_url}/v2/models/{name}/ready", 2.0) == 200

    def metrics(self) -> str:
        """The Prometheus text from the metrics endpoint."""
        url = f"http://{self.metrics_url}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.read().decode("utf-8", errors="replace")
        except OSError as exc:
            raise ServerError(f"reading metrics from {url} failed: {exc}") from exc


class _PortInUse(Exception):
    def __init__(self, error: ServerError) -> None:
        super().__init__(str(error))
        self.error = error


def _die_with_parent_hook() -> Callable[[], None] | None:
    """A pre-exec hook asking Linux to SIGTERM the server when the thread that
    started it dies, so even a SIGKILLed supervisor leaves no server behind.
    The signal is tied to the forking thread, so only the main thread (which
    lives as long as the process) uses it."""
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    term = int(signal.SIGTERM)
    return lambda: prctl(1, term)  # 1 = PR_SET_PDEATHSIG


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _http_status(url: str, timeout: float) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, ValueError):
        return None


def log_errors(text: str) -> list[str]:
    """Triton's error messages (``E…`` glog lines and ``error:`` summaries)
    from a log, first line of each, model load failures first, without the
    ones every CPU-only start prints."""
    found: list[str] = []
    for line in text.splitlines():
        match = _ERROR_LINE.match(line)
        message = match.group(1) if match else None
        if message is None and line.lower().startswith("error:"):
            message = line
        if not message or any(b in message for b in _BENIGN_ERRORS):
            continue
        # glog quotes the message and escapes its newlines; keep the first line.
        message = message.strip().strip('"').split("\\n")[0].strip()
        if message and message not in found:
            found.append(message)
    return sorted(found, key=lambda m: "failed to load" not in m)
