"""The rollout state of a deployment on Kubernetes: one ConfigMap
(``<deployment>-rollout``) every router pod mounts read-only and watches,
with the keys ``state.json`` and ``history.jsonl`` (the names of the files
in a rollout folder, so a mounted ConfigMap reads as one). Changes go to the
API server, never to the mount: ``change`` reads the object, plans the
change (``rollout_state.next_state``) and sends a JSON merge patch that
carries the ``resourceVersion`` it read, so two writers (the CLI and a
router's automatic rollback, or two routers) never lose each other's change:
the API server answers 409 to the one that comes second, which reads again
and retries. ``HttpConfigMap`` is the router's client (the pod's
ServiceAccount token, whose Role allows ``get`` and ``patch`` on that one
object and nothing else); the CLI's goes through ``kubectl``
(``trtspec.rollout.kube``). A router also reads the object through the API
every ``poll_s()`` seconds and offers it to its ``StateWatcher``: kubelet
refreshes a ConfigMap volume only at its next pod sync (a minute or more),
which alone would not bound how long a rollback takes to reach every
replica. Stdlib-only (imported by the router inside the Python backend stub).
"""

from __future__ import annotations

import json
import os
import ssl
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from trtspec.artifacts import rollout_state as st
from trtspec.artifacts.routing import RoutingTable
from trtspec.errors import RepoError

CONFIGMAP_ENV = "TRTSPEC_ROLLOUT_CONFIGMAP"
NAMESPACE_ENV = "TRTSPEC_ROLLOUT_NAMESPACE"
# The API server's base URL; unset in a pod: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT
API_ENV = "TRTSPEC_KUBE_API"
TOKEN_ENV = "TRTSPEC_KUBE_TOKEN_FILE"
POLL_ENV = "TRTSPEC_ROLLOUT_POLL_S"
# Where a router keeps what it may write (locks, shared in-flight counts)
# when its rollout folder is a read-only ConfigMap volume.
SCRATCH_ENV = "TRTSPEC_ROLLOUT_SCRATCH"
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")

STATE_KEY = st.STATE_FILE
HISTORY_KEY = st.HISTORY_FILE
# A ConfigMap holds at most 1 MiB (core/validation MaxConfigMapSize); the
# history keeps its most recent entries within this, oldest dropped first.
HISTORY_MAX_BYTES = 256 * 1024
POLL_S = 5.0
ATTEMPTS = 8  # reads and patches before giving up on a busy object
MERGE_PATCH = "application/merge-patch+json"


def configmap_name(deployment: str) -> str:
    """The rollout ConfigMap of the deployment named ``deployment``."""
    return f"{deployment}-rollout"


def poll_s() -> float:
    try:
        return max(0.1, float(os.environ.get(POLL_ENV) or POLL_S))
    except ValueError:
        return POLL_S


def scratch_dir(folder: Path) -> Path:
    """Where the router writes its locks and shared counts: the rollout
    folder itself, unless it is a ConfigMap volume (then ``SCRATCH_ENV``,
    or a folder under the temporary directory)."""
    named = os.environ.get(SCRATCH_ENV)
    if named:
        return Path(named)
    if os.environ.get(CONFIGMAP_ENV):
        return Path(tempfile.gettempdir()) / "trtspec-rollout"
    return Path(folder)


class Conflict(Exception):
    """The object changed since it was read (HTTP 409)."""


class KubeError(RepoError):
    """The API server (or kubectl) refused or could not be reached."""


@dataclass(frozen=True)
class ConfigMapData:
    data: dict[str, str]
    resource_version: str


class ConfigMapAPI(Protocol):
    """Read and patch one ConfigMap."""

    name: str
    namespace: str

    def get(self) -> ConfigMapData: ...

    def patch(self, data: dict[str, str], resource_version: str) -> ConfigMapData:
        """Merge ``data`` into the object if it is still at
        ``resource_version``; ``Conflict`` otherwise."""
        ...


def from_object(obj: dict[str, Any]) -> ConfigMapData:
    """A ConfigMap as the API server returns it (JSON)."""
    meta = obj.get("metadata") or {}
    data = obj.get("data") or {}
    return ConfigMapData({str(k): str(v) for k, v in data.items()}, str(meta["resourceVersion"]))


def patch_body(data: dict[str, str], resource_version: str) -> dict[str, Any]:
    """The merge patch of ``change``: ``resourceVersion`` makes it conditional
    (the registry answers Conflict when the object is no longer at it)."""
    return {"metadata": {"resourceVersion": resource_version}, "data": data}


def state_of(cm: ConfigMapData, where: str) -> st.RolloutState | None:
    text = cm.data.get(STATE_KEY)
    return None if not text else st.parse_state(text, f"{where} data.{STATE_KEY}")


def history_of(cm: ConfigMapData) -> list[dict[str, Any]]:
    out = []
    for line in cm.data.get(HISTORY_KEY, "").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def with_entry(history: str, entry: dict[str, Any], limit: int = HISTORY_MAX_BYTES) -> str:
    """``history`` (JSON lines) with ``entry`` appended, its oldest lines
    dropped until it fits in ``limit`` bytes."""
    lines = [line for line in history.splitlines() if line]
    lines.append(json.dumps(entry, sort_keys=True))
    size = sum(len(line.encode("utf-8")) + 1 for line in lines)
    while len(lines) > 1 and size > limit:
        size -= len(lines.pop(0).encode("utf-8")) + 1
    return "".join(line + "\n" for line in lines)


def change(
    api: ConfigMapAPI,
    digest: str,
    table: RoutingTable,
    route: str,
    **change_args: Any,
) -> tuple[dict[str, Any], st.RolloutState] | None:
    """One change of ``route`` (``rollout_state.next_state``'s arguments)
    made in the ConfigMap: the history entry and the new state, or None when
    ``only_if`` says not to. Retries on a conflict, reading again each time."""
    where = f"configmap {api.namespace}/{api.name}"
    for _ in range(ATTEMPTS):
        cm = api.get()
        planned = st.next_state(state_of(cm, where), digest, table, route, **change_args)
        if planned is None:
            return None
        state, entry = planned
        data = {
            STATE_KEY: json.dumps(state.to_dict(), indent=2, sort_keys=True) + "\n",
            HISTORY_KEY: with_entry(cm.data.get(HISTORY_KEY, ""), entry),
        }
        try:
            api.patch(data, cm.resource_version)
        except Conflict:
            continue
        return entry, state
    raise KubeError(
        f"{where}: changed by others {ATTEMPTS} times while this change was being made",
        "Try again; see `trtspec rollout history --kube` for what changed.",
    )


class HttpConfigMap:
    """The router's client: the API server over HTTPS with the pod's
    ServiceAccount token (read at every call: kubelet rotates it)."""

    def __init__(
        self,
        name: str,
        namespace: str,
        base_url: str,
        token_file: Path,
        *,
        ca_file: Path | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        self.name, self.namespace = name, namespace
        self.base_url = base_url.rstrip("/")
        self.token_file = Path(token_file)
        self.timeout_s = timeout_s
        self._context = (
            ssl.create_default_context(cafile=str(ca_file))
            if ca_file is not None and self.base_url.startswith("https:")
            else None
        )
        quote = urllib.parse.quote
        self.url = (
            f"{self.base_url}/api/v1/namespaces/{quote(namespace, safe='')}"
            f"/configmaps/{quote(name, safe='')}"
        )

    @classmethod
    def from_env(cls) -> HttpConfigMap | None:
        """The client the pod's environment names (``CONFIGMAP_ENV``), or None."""
        name = os.environ.get(CONFIGMAP_ENV)
        if not name:
            return None
        namespace = os.environ.get(NAMESPACE_ENV)
        if not namespace:
            try:
                namespace = (SERVICE_ACCOUNT / "namespace").read_text().strip()
            except OSError:
                namespace = "default"
        base = os.environ.get(API_ENV)
        if not base:
            host = os.environ.get("KUBERNETES_SERVICE_HOST", "kubernetes.default.svc")
            port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            host = f"[{host}]" if ":" in host else host
            base = f"https://{host}:{port}"
        token = Path(os.environ.get(TOKEN_ENV) or SERVICE_ACCOUNT / "token")
        ca = SERVICE_ACCOUNT / "ca.crt"
        return cls(name, namespace, base, token, ca_file=ca if ca.is_file() else None)

    def _call(self, method: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            token = self.token_file.read_text().strip()
        except OSError as exc:
            raise KubeError(
                f"cannot read the ServiceAccount token {self.token_file}: {exc}",
                "Mount the pod's token (automountServiceAccountToken).",
            ) from exc
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = MERGE_PATCH
        request = urllib.request.Request(self.url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(
                request, timeout=self.timeout_s, context=self._context
            ) as response:
                result: dict[str, Any] = json.loads(response.read())
                return result
        except urllib.error.HTTPError as exc:
            if exc.code == 409:
                raise Conflict(_status_message(exc)) from exc
            raise KubeError(
                f"{method} {self.url}: HTTP {exc.code}: {_status_message(exc)}",
                "The router's Role must allow get and patch on this ConfigMap.",
            ) from exc
        except (OSError, ValueError) as exc:
            raise KubeError(f"{method} {self.url}: {exc}", "Is the API server reachable?") from exc

    def get(self) -> ConfigMapData:
        return from_object(self._call("GET"))

    def patch(self, data: dict[str, str], resource_version: str) -> ConfigMapData:
        return from_object(self._call("PATCH", patch_body(data, resource_version)))


def _status_message(exc: urllib.error.HTTPError) -> str:
    """The ``message`` of the API server's Status body, else the reason."""
    try:
        return str(json.loads(exc.read()).get("message") or exc.reason)
    except (OSError, ValueError, AttributeError):
        return str(exc.reason)
