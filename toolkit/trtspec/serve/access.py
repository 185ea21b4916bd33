"""Who may change a served tritonserver: model control and the restricted APIs.

With ``--model-control-mode=explicit`` Triton's repository API loads any model
a client names, ``file:`` overrides included — a Python model uploaded that way
runs as the server's user. So a server trtspec starts has **no model
control**: ``--model-control-mode=none`` (the default), which loads every
model of the repository it is given at start and refuses every load and
unload (``explicit model load / unload is not allowed …``). ``serve
--variant`` gets exactly the models it needs from a repository *view*, a
private folder of symlinks to those model folders (``supervisor``). Nothing
trtspec runs needs the control API at serve time: the stub watchdog recovers
by restarting the server, the benchmark only infers.

The other APIs that change or expose server state (``RESTRICTED_APIS``:
repository index and control, shared-memory registration, logging, trace)
are closed to every client with ``--http-restricted-api`` /
``--grpc-restricted-protocol`` (grammar ``<api>[,<api>…]:<header>=<value>``,
parsed by ``TritonParser::ParseRestrictedFeatureOption`` in the 2.51
server's ``src/command_line_parser.cc``; the gRPC frontend prefixes the
header with ``triton-grpc-protocol-`` and compares name and value exactly)
set to a header no request can carry (``CLOSED_HEADER: CLOSED_VALUE``).
Triton 2.51 reads its options only from its command line (``getopt_long``;
no option file, no environment variable), and a process's command line is
readable by every local user, so no secret can be handed to it unseen; a
header no client can send needs no secret. Probed against the bundled
2.51 binary with hand-made requests (tests/fixtures/admin_probe.py): over
HTTP/1.1 the value's line feed ends the header line (the server answers 403
or drops the request); over HTTP/2 grpc-core accepts a line feed in a value
(so the value alone would not do) but refuses a header block with an
upper-case name ("Missing :method header"; RFC 9113 §8.2.1: names are lower
case), and Triton keeps the configured name's case, so the gRPC name never
matches.

``control=True`` (tests that unload a model to make a variant fail) keeps the
old policy: explicit model control and a random key (``new_admin_key``) on
the command line, readable by any local user — never for a shared machine.
"""

from __future__ import annotations

import ipaddress
import os
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


# The header the restricted APIs expect when no client may use them (module
# docstring): an upper-case name no HTTP/2 (gRPC) request can carry, and a
# value with a line feed no HTTP/1.1 request can carry.
CLOSED_HEADER = "Trtspec-Closed"
CLOSED_VALUE = "closed\nno-client-can-send-this"


def closed_api_args() -> list[str]:
    """The tritonserver flags that close ``RESTRICTED_APIS`` to every client."""
    return restricted_api_args(CLOSED_VALUE, header=CLOSED_HEADER)


def root_warning(euid: int | None = None) -> str | None:
    """The warning to print when the server will run as root; ``None`` otherwise."""
    if (os.geteuid() if euid is None else euid) != 0:
        return None
    return (
        "Warning: tritonserver will run as root: a model that misbehaves (a Python "
        "backend model runs arbitrary code) does so with root's rights. Run trtspec as an "
        "unprivileged user (in a container: `USER` in the image, or `docker run --user`)."
    )


def new_admin_key() -> str:
    """A fresh random key (128 bits, hex: no character Triton's parser splits on)."""
    return secrets.token_hex(16)


def restricted_api_args(key: str, header: str = ADMIN_HEADER) -> list[str]:
    """The tritonserver flags restricting ``RESTRICTED_APIS`` to ``header: key``
    on HTTP and gRPC."""
    apis = ",".join(RESTRICTED_APIS)
    return [f"{flag}{apis}:{header}={key}" for flag in _FLAGS]


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
        f"{port(grpc_port)}), and read the metrics (on {port(metrics_port)}). No model can be "
        f"loaded (model control is off) and the {restricted} APIs are closed. Bind 127.0.0.1 (the "
        "default) unless other machines must reach the server, and then put it behind a "
        "firewall or an authenticating proxy."
    )


def trtllm_serve_exposure_warning(host: str, ports: list[int]) -> str | None:
    """The warning ``trtspec serve-llmapi`` prints before its trtllm-serve
    processes bind ``host``; ``None`` for loopback. trtllm-serve has no key of
    ours in front of it: its OpenAI-compatible API answers whoever reaches it."""
    if is_loopback(host):
        return None
    where = ", ".join(str(p) for p in ports) or "its ports"
    return (
        f"Warning: --host {host} is not a loopback address. Anyone who can reach this machine "
        f"can, without authentication or TLS, run inference through trtllm-serve's "
        f"OpenAI-compatible API and read its health and metrics (HTTP on {where}). Bind "
        "127.0.0.1 (the default) unless other machines must reach the servers, and then put "
        "them behind a firewall or an authenticating proxy."
    )
