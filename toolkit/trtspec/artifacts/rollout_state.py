"""The rollout's files and the state the router serves from.

``trtspec repo`` writes ``router/rollout.json`` (``RolloutConfig``: the ramp,
the window, the decision thresholds, the golden set and what each variant is,
for the log). While serving, the rollout folder (``router/rollout/`` unless
``TRTSPEC_ROLLOUT_DIR`` names another) holds ``state.json`` — the current
share of each route on its variant, changed only by ``change`` (atomic
replace, under a lock, so the CLI and the router's automatic rollback never
lose each other's update) — and ``history.jsonl``, one line per change with
who, when and why. ``StateWatcher`` is the router's view: it re-reads
``state.json`` when the file changes, and applies it only when the state
names the digest of the routing table the router serves, so a state written
for another routing table (another benchmark's decision) is refused, as
``trtspec repo`` refuses a stale routing file. Stdlib-only (imported by the
router inside the Python backend stub).
"""

from __future__ import annotations

import contextlib
import dataclasses
import getpass
import hashlib
import json
import math
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtspec.artifacts.routing import RoutingTable
from trtspec.catalogue import DEFAULT_STEPS
from trtspec.errors import RepoError
from trtspec.fsutil import atomic_write_json

CONFIG_FILE = "rollout.json"
STATE_DIR = "rollout"
STATE_FILE = "state.json"
HISTORY_FILE = "history.jsonl"
LOG_FILE = "requests.jsonl"
GOLDEN_FILE = "golden.jsonl"
LOCK_FILE = ".lock"
DIR_ENV = "TRTSPEC_ROLLOUT_DIR"
SCHEMA_VERSION = 1

RAMPING, COMPLETE, ROLLED_BACK = "ramping", "complete", "rolled_back"

# How often the router looks at state.json (a stat) for a change.
POLL_S = 0.2

# The bench thresholds a live window is judged with (spec bench.decision).
THRESHOLD_KEYS = ("min_speedup", "max_p95_regression", "max_error_rate")
DEFAULT_THRESHOLDS = {"min_speedup": 1.05, "max_p95_regression": 0.10, "max_error_rate": 0.01}


@dataclass(frozen=True)
class RolloutConfig:
    """``router/rollout.json``: what the router needs to log, watch and ramp."""

    model: str = ""
    steps: tuple[int, ...] = DEFAULT_STEPS
    window_requests: int = 200
    min_requests: int = 20
    golden_every: int = 0
    golden_max_tokens: int = 32
    auto_rollback: bool = True
    thresholds: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_THRESHOLDS))
    log: dict[str, Any] = field(
        default_factory=lambda: {
            "destination": "file",
            "max_bytes": 10 * 1024 * 1024,
            "backups": 3,
            "queue": 10000,
            "prompts": False,
        }
    )
    # variant -> {speculative, draft_model, num_speculative_tokens}
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    # route -> golden prompts (text_input as the client sends it)
    golden: dict[str, list[str]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["steps"] = list(self.steps)
        return {"schema_version": SCHEMA_VERSION, **data}

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = CONFIG_FILE) -> RolloutConfig:
        if data.get("schema_version") != SCHEMA_VERSION:
            raise RepoError(
                f"{source}: schema_version: unsupported {data.get('schema_version')!r}",
                "Rebuild the repository with `trtspec repo`.",
            )
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        if "steps" in kwargs:
            kwargs["steps"] = tuple(int(s) for s in kwargs["steps"])
        base = cls()
        if "log" in kwargs:
            kwargs["log"] = {**base.log, **kwargs["log"]}
        if "thresholds" in kwargs:
            kwargs["thresholds"] = {**base.thresholds, **kwargs["thresholds"]}
        return cls(**kwargs)

    @classmethod
    def load(cls, router_dir: Path) -> RolloutConfig:
        """The router folder's ``rollout.json``; defaults when there is none
        (a repository assembled before rollouts, or a test's hand-made router)."""
        path = Path(router_dir) / CONFIG_FILE
        if not path.is_file():
            return cls()
        try:
            return cls.from_dict(json.loads(path.read_text(encoding="utf-8")), str(path))
        except ValueError as exc:
            raise RepoError(
                f"{path}: not valid JSON: {exc}", "Rebuild it with `trtspec repo`."
            ) from exc


def rollout_dir(router_dir: Path) -> Path:
    """Where the state, history and logs live for the router in ``router_dir``."""
    named = os.environ.get(DIR_ENV)
    return Path(named) if named else Path(router_dir) / STATE_DIR


def routing_digest(routing_path: Path) -> str:
    """sha256 of the routing table file the router serves (its exact bytes)."""
    return hashlib.sha256(Path(routing_path).read_bytes()).hexdigest()


@dataclass(frozen=True)
class RouteState:
    percent: float
    status: str = RAMPING


@dataclass(frozen=True)
class RolloutState:
    routing_sha256: str
    routes: dict[str, RouteState] = field(default_factory=dict)
    # One more at every change: where two copies of the state are read (a
    # mounted ConfigMap and the API server, artifacts.rollout_kube), the router
    # serves the one with the higher revision.
    revision: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "routing_sha256": self.routing_sha256,
            "revision": self.revision,
            "routes": {
                name: {"percent": r.percent, "status": r.status} for name, r in self.routes.items()
            },
        }


# The largest state.json read (a few routes take a few hundred bytes).
MAX_STATE_BYTES = 1 << 20
STATUSES = (RAMPING, COMPLETE, ROLLED_BACK)
_PLAIN = re.compile(r"[\w.-]{1,64}")
_FIX = "Set it with `trtspec rollout advance/rollback`, or delete the file to start afresh."


class StaleState(RepoError):
    """A well-formed state written for another routing table (its digest)."""


def _shown(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**12:
        return f"an integer of {len(str(abs(value)))} digits"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _percent(value: Any) -> float | None:
    """``value`` as a share in [0, 100], or None when it is not one (a bool,
    a string, NaN, an infinity, out of range; an integer is compared as it
    is, never converted: one of 400 digits has no float)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return float(value) if 0 <= value <= 100 else None


def validate_state(data: Any, source: str, digest: str | None = None) -> RolloutState:
    """The parsed ``state.json`` ``data`` as a ``RolloutState``, or a
    ``RepoError`` naming ``source``, the field and the fix: a known
    ``schema_version``, a sha256 ``routing_sha256`` (``StaleState`` when it
    is not ``digest``), and per route a finite ``percent`` from 0 to 100
    and a known ``status``. The one check the router's watcher, ``trtspec
    rollout`` and ``change`` (before it writes) all make."""

    def bad(where: str, message: str) -> RepoError:
        return RepoError(f"{source}: {where}: {message}", _FIX)

    if not isinstance(data, dict):
        raise bad("<root>", f"expected a JSON object, got {type(data).__name__}")
    version = data.get("schema_version")
    if isinstance(version, bool) or version != SCHEMA_VERSION:
        raise bad(
            "schema_version", f"unsupported {_shown(version)} (this trtspec reads {SCHEMA_VERSION})"
        )
    sha = data.get("routing_sha256")
    if not isinstance(sha, str) or len(sha) != 64 or set(sha) - set("0123456789abcdef"):
        raise bad("routing_sha256", f"must be a sha256 in hex, got {_shown(sha)}")
    if digest is not None and sha != digest:
        raise StaleState(
            f"{source}: routing_sha256: written for another routing table "
            f"(sha256 {sha[:12]}, serving {digest[:12]})",
            _FIX,
        )
    raw = data.get("routes")
    if not isinstance(raw, dict):
        raise bad("routes", f"expected an object of route name to state, got {_shown(raw)}")
    revision = data.get("revision", 0)
    if isinstance(revision, bool) or not isinstance(revision, int) or revision < 0:
        raise bad("revision", f"must be a whole number from 0, got {_shown(revision)}")
    routes: dict[str, RouteState] = {}
    for name, entry in raw.items():
        where = f"routes.{name}" if _PLAIN.fullmatch(name) else f"routes[{_shown(name)}]"
        if not isinstance(entry, dict):
            raise bad(where, f"expected an object, got {_shown(entry)}")
        percent = _percent(entry.get("percent"))
        if percent is None:
            raise bad(
                f"{where}.percent",
                f"must be a number from 0 to 100, got {_shown(entry.get('percent'))}",
            )
        status = entry.get("status", RAMPING)
        if status not in STATUSES:
            raise bad(
                f"{where}.status",
                f"unknown {_shown(status)} (one of: {', '.join(STATUSES)})",
            )
        routes[name] = RouteState(percent, status)
    return RolloutState(sha, routes, revision)


def read_state(path: Path, digest: str | None = None) -> RolloutState | None:
    """``state.json`` (``validate_state``), or None when there is none yet.
    Refused besides: anything but a regular file (a FIFO would hold the
    reader), one over ``MAX_STATE_BYTES``, and a link whose target lies
    outside its folder (the links of a ConfigMap's ``..data`` layout stay
    inside)."""
    path = Path(path)
    if not os.path.lexists(path):
        return None
    real, folder = os.path.realpath(path), os.path.realpath(path.parent)
    if os.path.commonpath([real, folder]) != folder:
        raise RepoError(
            f"{path}: a link to {real}, outside {folder}",
            "Write the state in the rollout folder (`trtspec rollout`), not a link out of it.",
        )
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_STATE_BYTES:
            raise RepoError(f"{path}: not a regular file of at most {MAX_STATE_BYTES} bytes", _FIX)
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (ValueError, OSError) as exc:  # ValueError: not UTF-8
        raise RepoError(
            f"{path}: cannot be read: {getattr(exc, 'strerror', None) or exc}", _FIX
        ) from exc
    return parse_state(text, path, digest)


def parse_state(text: str, path: Path | str, digest: str | None = None) -> RolloutState:
    """The text of a ``state.json`` (``path`` names where it came from in
    errors), checked by ``validate_state``."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
        raise RepoError(f"{path}: not valid JSON: {exc}", _FIX) from exc
    return validate_state(data, str(path), digest)


def effective_table(table: RoutingTable, state: RolloutState | None) -> RoutingTable:
    """``table`` with each route's share on its variant taken from ``state``."""
    if state is None:
        return table
    routes = dict(table.routes)
    for name, route_state in state.routes.items():
        rule = routes.get(name)
        if rule is not None:
            routes[name] = dataclasses.replace(rule, canary_percent=route_state.percent)
    return dataclasses.replace(table, routes=routes)


def current(table: RoutingTable, state: RolloutState | None, route: str) -> RouteState:
    """Where ``route`` stands: from ``state``, else where the table starts it."""
    if state is not None and route in state.routes:
        return state.routes[route]
    rule = table.routes[route]
    return RouteState(rule.canary_percent, COMPLETE if rule.canary_percent >= 100 else RAMPING)


def step_after(steps: tuple[int, ...] | list[int], percent: float) -> int | None:
    """The next step of the ramp above ``percent``; None at 100."""
    return next((s for s in steps if s > percent), None)


def who() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry in some containers
        return f"uid {os.getuid()}"


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    import fcntl

    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LOCK_FILE, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def append_history(folder: Path, entry: dict[str, Any]) -> None:
    """One line of ``history.jsonl`` (a single O_APPEND write)."""
    folder.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(entry, sort_keys=True) + "\n").encode("utf-8")
    fd = os.open(folder / HISTORY_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_history(folder: Path) -> list[dict[str, Any]]:
    path = Path(folder) / HISTORY_FILE
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def next_state(
    state: RolloutState | None,
    digest: str,
    table: RoutingTable,
    route: str,
    *,
    percent: float,
    status: str,
    action: str,
    by: str,
    why: str,
    details: dict[str, Any] | None = None,
    only_if: Callable[[RouteState], bool] | None = None,
) -> tuple[RolloutState, dict[str, Any]] | None:
    """The state after one change of ``route`` and its history entry (None
    when ``only_if``, given the route's state now, says not to): what
    ``change`` writes to the folder and ``artifacts.rollout_kube`` to a ConfigMap."""
    revision = state.revision if state is not None else 0
    if state is not None and state.routing_sha256 != digest:
        state = None  # written for another routing table: start from this one
    before = current(table, state, route)
    if only_if is not None and not only_if(before):
        return None
    raw = RolloutState(digest, dict(state.routes) if state is not None else {}, revision + 1)
    data = raw.to_dict()
    data["routes"][route] = {"percent": percent, "status": status}
    # what the router would refuse is never written
    after = validate_state(data, f"{STATE_FILE} (as it would be written)", digest)
    entry = {
        "when": now_iso(),
        "who": by,
        "why": why,
        "route": route,
        "action": action,
        "from_percent": before.percent,
        "to_percent": after.routes[route].percent,
        "status": status,
        "routing_sha256": digest,
        **(details or {}),
    }
    return after, entry


def change(
    folder: Path,
    routing_path: Path,
    table: RoutingTable,
    route: str,
    *,
    percent: float,
    status: str,
    action: str,
    by: str,
    why: str,
    details: dict[str, Any] | None = None,
    only_if: Callable[[RouteState], bool] | None = None,
) -> dict[str, Any] | None:
    """Set ``route`` to ``percent``/``status`` in ``state.json`` and append the
    change to the history; returns the history entry, or None when
    ``only_if`` (given the route's state under the lock) says not to."""
    folder = Path(folder)
    digest = routing_digest(routing_path)
    with _locked(folder):
        planned = next_state(
            read_state(folder / STATE_FILE),  # an invalid one is refused: nothing written
            digest,
            table,
            route,
            percent=percent,
            status=status,
            action=action,
            by=by,
            why=why,
            details=details,
            only_if=only_if,
        )
        if planned is None:
            return None
        state, entry = planned
        atomic_write_json(folder / STATE_FILE, state.to_dict())
        append_history(folder, entry)
    return entry


class StateWatcher:
    """The routing table the router serves now: its base table with the
    rollout state applied, re-read (at most every ``POLL_S``) when
    ``state.json`` is replaced. A state ``read_state`` refuses (invalid, or
    for another routing table) is refused with one ``warn`` line and a call
    of ``refused`` per version of the file, and the last good table kept;
    at the start, with no good state yet, an invalid one leaves every route
    on its fallback (a state for another routing table: the base table).

    ``folder`` may be a ConfigMap volume (kubelet replaces its ``..data``
    symlink; ``state.json`` is a symlink through it, so a change shows as a
    new inode). ``offer`` hands it a state read elsewhere (the API server,
    ``artifacts.rollout_kube``); of the two, the one with the higher revision is
    served."""

    def __init__(
        self,
        table: RoutingTable,
        routing_path: Path,
        folder: Path,
        warn: Callable[[str], None] = lambda _m: None,
        refused: Callable[[], None] = lambda: None,
    ) -> None:
        self.base = table
        self.routing_path = Path(routing_path)
        self.folder = Path(folder)
        self.digest = routing_digest(routing_path)
        self._warn = warn
        self._refused = refused
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int] | None = None
        self._next = 0.0
        self._table = table
        self._good = False  # a state (or its absence) was applied
        self.state: RolloutState | None = None
        self._offered: RolloutState | None = None
        self._on_disk: RolloutState | None = None
        self.refresh(force=True)

    def offer(self, state: RolloutState | None) -> None:
        """The state as another copy has it now (None: that copy has none);
        served at once when its revision is above the folder's."""
        if state is not None and state.routing_sha256 != self.digest:
            state = None
        with self._lock:
            self._offered = state
            self._apply()

    def _apply(self) -> None:
        state, offered = self._on_disk, self._offered
        if offered is not None and (state is None or offered.revision > state.revision):
            state = offered
        self.state = state
        self._table = effective_table(self.base, state)

    def refresh(self, *, force: bool = False) -> RoutingTable:
        now = time.monotonic()
        if not force and now < self._next:
            return self._table
        with self._lock:
            self._next = now + POLL_S
            path = self.folder / STATE_FILE
            try:
                st = os.stat(path)
                key: tuple[int, int, int] | None = (st.st_ino, st.st_mtime_ns, st.st_size)
            except FileNotFoundError:  # none, or a link to nothing (read_state judges it)
                key = (-1, 0, 0) if os.path.islink(path) else None
            except OSError:  # not searchable, say: read_state says so
                key = (-2, 0, 0)
            if key == self._seen and not force:
                return self._table
            self._seen = key
            try:
                state = read_state(path, self.digest) if key is not None else None
            except RepoError as exc:
                if self._good:
                    keep = "keeping the last good state"
                elif isinstance(exc, StaleState):  # as if there were none (a new table)
                    keep, self._good = "serving the routing table as written", True
                else:  # revision -1: any copy offered (the API server's) is served over it
                    zero = {n: RouteState(0.0) for n in self.base.routes}
                    self._on_disk = RolloutState(self.digest, zero, revision=-1)
                    self._apply()
                    keep = "every route on its fallback until a valid state is written"
                self._warn(f"rollout: refused {exc.message}; {keep}")
                with contextlib.suppress(Exception):  # a metric never fails the router
                    self._refused()
                return self._table
            self._good = True
            self._on_disk = state
            self._apply()
            return self._table

    def table(self) -> RoutingTable:
        return self.refresh()

    def last(self) -> RoutingTable:
        """The table served now, without a look at the file."""
        return self._table
