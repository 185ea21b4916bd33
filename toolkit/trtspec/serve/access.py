"""Who may change a served tritonserver: the restricted APIs and their key.

With ``--model-control-mode=explicit`` Triton's repository API loads any model
a client names, ``file:`` overrides included — a Python model uploaded that way
runs as the server's user. Every server trtspec starts therefore restricts the
APIs that change or expose server state (``RESTRICTED_APIS``) on both
protocols, with ``--http-restricted-api`` / ``--grpc-restricted-protocol``
(grammar ``<api>[,<api>…]:<header>=<value>``, parsed by
``TritonParser::ParseRestrictedFeatureOption`` in the 2.51 server's
``src/command_line_parser.cc``; the gRPC frontend prefixes the header with
``triton-grpc-protocol-``). The value is a random key made per server
(``new_admin_key``); only the ``Server`` object that started the server holds
it and sends it. Inference, health, metadata, model-config and statistics stay
open: the benchmark, tritonclient and perf_analyzer use them and none changes
what the server runs.

Limit: Triton reads the key from its command line only, and a process's
command line is readable by every local user unless ``/proc`` is mounted with
``hidepid=2``. The key keeps out other machines and web pages (which cannot
read the process list); on a machine shared with untrusted users, mount
``/proc`` with ``hidepid=2`` or run the server in its own container.
"""

from __future__ import annotations

import ipaddress
import secrets

# The APIs a server started by trtspec refuses without the key. model-repository:
# load/unload (with file: overrides = code execution) and the index. shared-memory:
# registering a region by name lets a client make the server read or write any
# /dev/shm region the server's user can open, the Python backend's own included.
# logging and trace: change what the server writes and where.
RESTRICTED_APIS = ("model-repository", "shared-memory", "logging", "trace")
# The header carrying the key (HTTP headers are case-insensitive; gRPC metadata
# keys must be lower case, and Triton prefixes this one with GRPC_HEADER_PREFIX).
ADMIN_HEADER = "trtspec-admin-key"
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"
_FLAGS = ("--http-restricted-api=", "--grpc-restricted-protocol=")


def new_admin_key() -> str:
    """A fresh random key (128 bits, hex: no character Triton's parser splits on)."""
    return secrets.token_hex(16)


def restricted_api_args(key: str) -> list[str]:
    """The tritonserver flags restricting ``RESTRICTED_APIS`` to ``key`` on HTTP and gRPC."""
    apis = ",".join(RESTRICTED_APIS)
    return [f"{flag}{apis}:{ADMIN_HEADER}={key}" for flag in _FLAGS]


def sets_restrictions(args: list[str]) -> bool:
    """Whether ``args`` already restrict APIs themselves (the caller's own policy)."""
    return any(arg.startswith(_FLAGS) or arg in (f.rstrip("=") for f in _FLAGS) for arg in args)


def admin_headers(key: str, protocol: str = "http") -> dict[str, str]:
    """The header(s) a client sends with ``key`` on ``protocol`` ("http" or "grpc")."""
    if protocol not in ("http", "grpc"):
        raise ValueError(f"protocol must be 'http' or 'grpc', not {protocol!r}")
    name = ADMIN_HEADER if protocol == "http" else GRPC_HEADER_PREFIX + ADMIN_HEADER
    return {name: key}


def is_loopback(host: str) -> bool:
    """Whether a server bound to ``host`` is reachable from this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: assume it resolves to a reachable address


def exposure_warning(host: str, http_port: int, grpc_port: int, metrics_port: int) -> str | None:
    """The warning to print before binding ``host``; ``None`` for loopback."""
    if is_loopback(host):
        return None

    def port(n: int) -> str:
        return str(n) if n else "a free port"

    restricted = ", ".join(RESTRICTED_APIS[:-1]) + " and " + RESTRICTED_APIS[-1]
    return (
        f"Warning: --host {host} is not a loopback address. Anyone who can reach this machine "
        f"can, without authentication or TLS: run inference and read health, metadata, model "
        f"configurations and statistics (HTTP on {port(http_port)}, gRPC on "
        f"{port(grpc_port)}), and read the metrics (on {port(metrics_port)}). The {restricted} "
        "APIs need a random key that only this trtspec process sends. Bind 127.0.0.1 (the "
        "default) unless other machines must reach the server, and then put it behind a "
        "firewall or an authenticating proxy."
    )
