"""The tritonserver supervisor: start, readiness, logs and teardown.

Owns ``Server``, which picks its command line (built by ``launch``: one server,
or for TP×PP > 1 ``mpirun`` in leader mode or, with several engine models,
orchestrator mode; ports picked free, 127.0.0.1 unless told otherwise, explicit
loading of a model list). It starts tritonserver in its own process group with
its log in a file, waits for ``/v2/health/ready`` with a deadline (failing with
the log's errors and tail), and stops it with SIGTERM then SIGKILL so that no
server or Python-backend stub outlives it — also when the supervising process
is killed: through the parent-death signal, and through a guard process
(``serve/guard.py``) that notices its owner is gone at any moment (start,
steady, stop) and removes what the server left. Every server restricts the
model-repository API and the other state-changing APIs to a random key only no
client can send (``trtspec.serve.access``): a server has no model control (mode
``none``); ``models`` are served from a private repository view of symlinks,
and the engine folders are checked against their build manifests before the
first start (``verify_engines``). Each server gets its own Python-backend
shared-memory prefix (``trtspec_<pid>_<random>_``): a server stopped gracefully
removes its regions itself, after a SIGKILL (a crashed stub, a start that timed
out) ``stop()`` removes the ones it left in ``/dev/shm``, and a new ``Server``
removes the regions of owners that died without either. ``restart()`` brings a
server back on the same ports.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

from trtspec.errors import ServerError
from trtspec.procutil import parent_death_hook, pid_alive
from trtspec.runtime.cancel import DIR_ENV as CANCEL_DIR_ENV
from trtspec.runtime.health import DOWN_ENV
from trtspec.runtime.health import clear as clear_flags
from trtspec.runtime.heartbeat import DIR_ENV as HEARTBEAT_ENV
from trtspec.serve.access import (
    admin_headers,
    closed_api_args,
    new_admin_key,
    restricted_api_args,
    sets_restrictions,
)
from trtspec.serve.discovery import TritonInstall, find_tritonserver
from trtspec.serve.launch import (
    LEADER,
    ORCHESTRATOR,
    ORCHESTRATOR_ENV,
    SHM_OPTION,
    SINGLE,
    launch_mode,
    leader_mode_argv,
    orchestrator_mode_argv,
    server_argv,
    visible_gpus,
)
from trtspec.serve.manifest import verify_engines

# Log lines Triton prints on every CPU-only start; they are not the reason a start failed.
_BENIGN_ERRORS = (
    "CudaDriverHelper has not been initialized",
    "Failed to initialize NVML",
)
SHM_DIR = Path("/dev/shm")
_OWN_SHM = re.compile(r"^trtspec_(\d+)_[0-9a-f]{8}_")
_GUARD = Path(__file__).with_name("guard.py")
GUARD_GRACE_S = 3.0
_ERROR_LINE = re.compile(r"^E\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [^\]]+\] ?(.*)$")


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
    """One supervised tritonserver (or ``mpirun`` leader/orchestrator-mode launch).

    Ports given as 0 are picked free at ``start()``; ``models`` (a list) are
    the only models served, from a repository view (model control stays
    off). The repository, shared-memory, logging and trace APIs are closed to
    every client (unless ``extra_args`` set restrictions of their own).
    ``control=True`` (tests only) instead starts ``--model-control-mode
    explicit`` (``--load-model`` each of ``models``, or ``*``) and opens
    those APIs to ``admin_headers()``, a key on the command line that every
    local user can read. Use as a context manager, or call ``start()`` and
    ``stop()``."""

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
        control: bool = False,
        verify: bool = True,
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
        self.launch_mode = launch_mode(world_size, self.engine_models)
        if self.launch_mode == ORCHESTRATOR:
            self.env = {**ORCHESTRATOR_ENV, **self.env}
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="tritonserver-", suffix=".log")
            os.close(fd)
            log_path = name
        self.log_path = Path(log_path).absolute()
        # Our own shared-memory prefix, unless the caller chose one.
        self.shm_prefix: str | None = None
        if not any(SHM_OPTION in arg for arg in self.extra_args):
            self.shm_prefix = f"trtspec_{os.getpid()}_{secrets.token_hex(4)}_"
        self.control = control
        self.verify = verify
        # The key to the restricted APIs: only with control; without, they are
        # closed to every client (None also when the caller's extra_args restrict them).
        self.admin_key: str | None = None
        if not sets_restrictions(self.extra_args):
            if control:
                self.admin_key = new_admin_key()
                self.extra_args += restricted_api_args(self.admin_key)
            else:
                self.extra_args += closed_api_args()
        # A private folder of this server's own: the repository view (models=)
        # and the cancellation flags. Named now so argv() stays pure; made at start.
        self.runtime_dir = Path(tempfile.gettempdir()) / (
            f"trtspec-server-{os.getpid()}-{secrets.token_hex(6)}"
        )
        self._verified = False
        self._process: subprocess.Popen[bytes] | None = None
        self._torn_down = False
        self._unloaded_stop = False  # stopped once every model had unloaded (see _wait_stopped)
        self._guard: subprocess.Popen[bytes] | None = None
        self._log_mode = "wb"
        self._restart_lock = threading.Lock()
        self.restarts = 0
        remove_stale_shm_regions()

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

    def admin_headers(self, protocol: str = "http") -> dict[str, str]:
        """Headers that open the restricted APIs ("http", or "grpc" for
        tritonclient.grpc's ``headers=``); empty when the caller restricts them."""
        return {} if self.admin_key is None else admin_headers(self.admin_key, protocol)

    # -- command line ------------------------------------------------------
    def argv(self) -> list[str]:
        """The command ``start()`` runs, with the ports chosen so far."""
        if self._ports is None:
            self._ports = self._choose_ports()
        http, grpc, metrics = self._ports
        binary, backend_dir = self.install.binary, self.install.backend_dir
        # Without model control, `models` are what the view holds; with it, explicit loads.
        repo, models = self.repo, self.models
        if self.control and models is None:
            models = ["*"]
        elif not self.control and models is not None:
            repo, models = self.view_dir, None
        if self.launch_mode == ORCHESTRATOR:
            one = server_argv(
                binary, repo, host=self.host, http_port=http, grpc_port=grpc,
                metrics_port=metrics, backend_dir=backend_dir, models=models,
                extra_args=["--disable-auto-complete-config",
                            f"--backend-config=python,{SHM_OPTION}{self.shm_prefix or 'prefix'}0_",
                            *self.extra_args],
            )  # fmt: skip
            seen = {**os.environ, **self.install.env, **self.env}
            return orchestrator_mode_argv(one, gpus=visible_gpus(seen, self.world_size))
        if self.launch_mode == LEADER:
            return leader_mode_argv(
                self.world_size, self.repo, engine_model=self.engine_models, host=self.host,
                http_port=http, grpc_port=grpc, metrics_port=metrics, binary=binary,
                backend_dir=backend_dir, models=models, extra_args=self.extra_args,
                shm_prefix=self.shm_prefix or "prefix",
                rank0_repo=repo if repo != self.repo else None,
            )  # fmt: skip
        # Every config trtspec writes is complete; Triton's auto-complete would
        # start one extra stub per Python model at load (importing its model.py)
        # only to be told nothing new.
        extra = ["--disable-auto-complete-config", *self.extra_args]
        if self.shm_prefix:
            extra.append(f"--backend-config=python,{SHM_OPTION}{self.shm_prefix}")
        return server_argv(
            binary, repo, host=self.host, http_port=http, grpc_port=grpc,
            metrics_port=metrics, backend_dir=backend_dir, models=models,
            extra_args=extra,
        )  # fmt: skip

    @property
    def down_dir(self) -> Path:
        """Where the watchdog marks variants down for the router (``trtspec.runtime.health``)."""
        return self.runtime_dir / "down"

    @property
    def heartbeat_dir(self) -> Path:
        """Where stubs that call decoupled BLS beat (``trtspec.runtime.heartbeat``)
        and the watchdog reads how long ago each did."""
        return self.runtime_dir / "heartbeat"

    @property
    def view_dir(self) -> Path:
        """The repository view served when ``models`` are given without control."""
        return self.runtime_dir / "repository"

    def _make_runtime_dir(self) -> None:
        """Create the private folder (mode 0700, ours: a name someone made
        first is an error, never used) with the repository view and the
        cancellation folder inside."""
        if self.runtime_dir.is_dir() and not self.runtime_dir.is_symlink():
            st = self.runtime_dir.lstat()
            if st.st_uid == os.getuid() and not st.st_mode & 0o077:
                return  # ours, from the previous start of this Server
        try:
            self.runtime_dir.mkdir(mode=0o700)
            (self.runtime_dir / "cancel").mkdir(mode=0o700)
            self.down_dir.mkdir(mode=0o700)
            self.heartbeat_dir.mkdir(mode=0o700)
            if self.models is not None and not self.control:
                self.view_dir.mkdir(mode=0o700)
                for name in self.models:
                    source = self.repo / name
                    if not source.is_dir():
                        raise ServerError(
                            f"model {name!r} is not a folder of {self.repo}",
                            hint="pass the names of model folders in the repository",
                        )
                    (self.view_dir / name).symlink_to(source, target_is_directory=True)
        except OSError as exc:
            raise ServerError(
                f"cannot create the server's private folder {self.runtime_dir}: {exc.strerror}",
                hint="check the temp folder ($TMPDIR): it must be writable",
            ) from exc

    def _remove_runtime_dir(self) -> None:
        # symlinks and flag files only: rmtree unlinks links, never follows them
        shutil.rmtree(self.runtime_dir, ignore_errors=True)

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

    def restart(self, timeout: float = 120.0, grace: float = 5.0) -> Server:
        """Stop the server and start it again on the same ports (its log
        continues in the same file). Concurrent callers restart it once:
        whoever waited for the lock finds it running and returns."""
        generation = self.restarts
        with self._restart_lock:
            if self.restarts != generation and self.running:
                return self
            ports = self._ports
            self._stop(grace=grace)  # the guard stays: it covers the next start too
            if ports is not None:
                self._requested = ports
            self.restarts += 1
            self._log_mode = "ab"
            # every stub starts afresh: no variant is down, no heartbeat is old
            for folder in (self.down_dir, self.heartbeat_dir):
                clear_flags(folder)
            self.start(timeout=timeout)
            return self

    def _start_guard(self) -> None:
        if self._guard is not None and self._guard.poll() is None:
            return
        try:
            self._guard = subprocess.Popen(
                [
                    sys.executable,
                    "-I",
                    str(_GUARD),
                    self.shm_prefix or "",
                    str(GUARD_GRACE_S),
                    str(self.runtime_dir),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError:
            self._guard = None  # the parent-death signal still covers the server

    def _tell_guard(self, line: str) -> None:
        guard = self._guard
        if guard is None or guard.stdin is None:
            return
        with contextlib.suppress(OSError, ValueError):
            guard.stdin.write(line.encode("ascii") + b"\n")
            guard.stdin.flush()

    def close_guard(self) -> None:
        """Let the guard go (after ``stop()``): it finds nothing left and exits."""
        guard, self._guard = self._guard, None
        if guard is None:
            return
        with contextlib.suppress(OSError, ValueError):
            if guard.stdin is not None:
                guard.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            guard.wait(timeout=GUARD_GRACE_S + 5.0)

    def _launch_and_wait(self, timeout: float) -> None:
        if self.verify and not self._verified:
            # before anything is loaded: a changed engine file is refused here
            verify_engines(self.repo, self.models)
            self._verified = True
        self._make_runtime_dir()
        argv = self.argv()
        env = {
            **os.environ,
            **self.install.env,
            CANCEL_DIR_ENV: str(self.runtime_dir / "cancel"),
            DOWN_ENV: str(self.down_dir),
            HEARTBEAT_ENV: str(self.heartbeat_dir),
            **self.env,
        }
        self._start_guard()
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            log = open(self.log_path, self._log_mode)  # noqa: SIM115 (closed below, after Popen)
        except OSError as exc:
            raise ServerError(
                f"cannot write the server log {self.log_path}: {exc.strerror}",
                hint="pick another log file (--log-file)",
            ) from exc
        self._process, self._torn_down, self._unloaded_stop = None, False, False
        try:
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
        except OSError as exc:
            raise ServerError(
                f"cannot start {argv[0]}: {exc.strerror}",
                hint="install Open MPI (the Triton TRT-LLM container ships it)"
                if argv[0] == "mpirun"
                else "check the tritonserver binary (--tritonserver)",
            ) from exc
        finally:
            log.close()
        self._tell_guard(f"pgid {self._process.pid}")
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
        lines = [ln for ln in text.splitlines() if ln.strip() and ln[0] not in "|+"]
        tail = "\n".join(lines[-15:])
        parts.append(f"log tail ({self.log_path}):\n{tail}" if tail else "the log is empty")
        hint = f"full log: {self.log_path}"
        if "already in use" in text:
            hint = (
                "another process holds one of the ports; pick others with --http-port, "
                f"--grpc-port and --metrics-port (0 = any free port); {hint}"
            )
        return ServerError("\n".join(parts), hint=hint)

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
        then SIGKILL whatever is left of it (stubs included), and let the
        guard go. Idempotent; returns the server's exit code."""
        try:
            return self._stop(grace)
        finally:
            self.close_guard()
            self._remove_runtime_dir()

    def _stop(self, grace: float) -> int | None:
        process = self._process
        if process is None:
            return None
        if self._torn_down:
            # The group is gone and its number may now belong to someone else.
            return 0 if self._unloaded_stop else process.returncode
        _LIVE.discard(self)
        pgid = process.pid  # start_new_session made the server a group leader
        unloaded = False
        if process.poll() is None:
            # The stubs ignore SIGTERM; tritonserver unloads each model (its
            # finalize, then the stub exits) once nothing is in flight.
            stubs = set(group_members(pgid)) - {pgid} if self.launch_mode == SINGLE else set()
            _signal_group(pgid, signal.SIGTERM)
            try:
                unloaded = _wait_stopped(process, pgid, stubs, grace)
            except subprocess.TimeoutExpired:
                _signal_group(pgid, signal.SIGKILL)
                process.wait()
        # A server that exited can leave stubs behind for a moment; none may outlive it.
        _signal_group(pgid, signal.SIGKILL)
        deadline = time.monotonic() + 10.0
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.02)
        self._torn_down = True
        self._tell_guard(f"gone {pgid}")
        if self.shm_prefix:
            remove_shm_regions(self.shm_prefix)
        if unloaded:
            self._unloaded_stop = True
        return 0 if self._unloaded_stop else process.returncode

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
        hint = f"log: {self.log_path}"
        if not self.control:
            raise ServerError(
                f"{what} failed: this server has no model control (trtspec serves a fixed "
                "set of models; a restart loads them again)",
                hint="tests that must unload a model start the Server with control=True",
            )
        request = urllib.request.Request(url, data=b"{}", method="POST")
        request.add_header("Content-Type", "application/json")
        for key, value in self.admin_headers("http").items():
            request.add_header(key, value)
        try:
            with urllib.request.urlopen(request, timeout=600):
                return
        except urllib.error.HTTPError as exc:
            body = exc.read().decode("utf-8", errors="replace")
            try:
                detail = json.loads(body).get("error", body)
            except (json.JSONDecodeError, AttributeError):
                detail = body
            raise ServerError(f"{what} failed: {detail}", hint=hint) from exc
        except OSError as exc:
            raise ServerError(f"{what} failed: {exc}", hint=hint) from exc

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
    """SIGTERM the server when the thread that started it dies, so even a
    SIGKILLed supervisor leaves no server behind. The signal is tied to the
    forking thread, so only the main thread (which lives as long as the
    process) asks for it."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return parent_death_hook(signal.SIGTERM)


def remove_shm_regions(prefix: str, shm_dir: Path = SHM_DIR) -> list[str]:
    """Unlink the shared-memory regions named ``<prefix>…`` (a dead server's
    Python-backend regions); returns the names removed."""
    if not prefix or not shm_dir.is_dir():
        return []
    removed = []
    for path in shm_dir.iterdir():
        if path.name.startswith(prefix):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(path.name)
    return sorted(removed)


def remove_stale_shm_regions(shm_dir: Path = SHM_DIR) -> list[str]:
    """Unlink the regions of trtspec servers whose owning process (the pid in
    ``trtspec_<pid>_<random>_``) no longer exists; returns the names removed."""
    if not shm_dir.is_dir():
        return []
    owners: dict[int, bool] = {}
    removed = []
    for path in shm_dir.iterdir():
        match = _OWN_SHM.match(path.name)
        if not match:
            continue
        pid = int(match.group(1))
        if pid not in owners:
            owners[pid] = pid_alive(pid)
        if not owners[pid]:
            with contextlib.suppress(FileNotFoundError, PermissionError):
                path.unlink()
                removed.append(path.name)
    return sorted(removed)


def _wait_stopped(
    process: subprocess.Popen[bytes], pgid: int, stubs: set[int], grace: float
) -> bool:
    """Wait up to ``grace`` seconds for a SIGTERMed server to exit; returns
    True when it was cut short because every model had unloaded, raises
    ``TimeoutExpired`` when neither happened in time.

    tritonserver first waits for in-flight requests, then unloads every model
    (each stub runs its ``finalize`` and exits: tritonserver waits for that),
    and only then, at the next whole second of its exit loop, tears itself
    down. Once every stub that was there at the signal has exited, nothing is
    in flight and nothing is left to finalize, so the remaining second is
    skipped with a SIGKILL. Without stubs to watch (leader and orchestrator
    launches, or a server without Python models) it waits for the exit."""
    deadline = time.monotonic() + grace
    while True:
        if process.poll() is not None:
            return False
        if stubs and not stubs.intersection(group_members(pgid)):
            try:
                process.wait(timeout=0.05)
                return False
            except subprocess.TimeoutExpired:
                _signal_group(pgid, signal.SIGKILL)
                process.wait()
                return True
        if time.monotonic() >= deadline:
            raise subprocess.TimeoutExpired(process.args, grace)
        time.sleep(0.02)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group ``pgid``, from /proc."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        state, _ppid, group = stat[stat.rindex(")") + 2 :].split()[:3]
        if int(group) == pgid and state not in ("Z", "X"):
            members.append(int(entry))
    return members


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
    from a log, first line of each, model load failures first and other
    "failed to" lines next, without the ones every CPU-only start prints."""
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
    return sorted(found, key=lambda m: ("failed to load '" not in m, "failed to" not in m))
