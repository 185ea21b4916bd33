"""No test and no benchmark addresses anything but loopback.

Every string literal in the Python sources under ``tests/`` and
``benchmarks/`` (docstrings and f-string parts included) and every text
file beside them is scanned for IP literals, URLs and domain names. Only
loopback may appear (127.0.0.0/8, ::1, ``localhost``); the few other
addresses the suite needs as *data* — an argv builder's input, a loopback
classifier's negative case, an environment variable a sandbox must strip —
are allow-listed below, each with the reason nothing connects to it. An
allow-list entry that no longer matches fails too, so the list shrinks
with the code.
"""

from __future__ import annotations

import ast
import ipaddress
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("tests", "benchmarks")

# (file relative to the repository root, address) → why it is not traffic.
ALLOWED: dict[tuple[str, str], str] = {
    ("*", "nvcr.io"): (
        "the registry in a container image name (spec field, doctor advice); no test pulls"
    ),
    ("tests/unit/test_serve.py", "0.0.0.0"): (
        "bind-address input to server_argv/Server.argv: asserted as argv text, no process starts"
    ),
    ("tests/unit/test_serve.py", "::"): "negative case of the loopback classifier; no socket",
    ("tests/fixtures/shared.py", "::"): "pytest's node-id separator (file::test); no address",
    ("tests/unit/test_sabotage_script.py", "::"): (
        "pytest's node-id separator (file::test); no address"
    ),
    ("tests/unit/test_serve.py", "10.0.0.7"): (
        "negative case of the loopback classifier; no socket"
    ),
    ("tests/unit/test_serve.py", "gpu-box.example"): (
        "negative case of the loopback classifier (RFC 2606 .example never resolves); no socket"
    ),
    ("tests/unit/test_serve_cli.py", "0.0.0.0"): (
        "--host given to `trtspec serve --tritonserver /bin/false`: the warning is "
        "checked, /bin/false binds nothing"
    ),
    ("tests/unit/test_llmapi_serve.py", "0.0.0.0"): (
        "--host given to `trtspec serve-llmapi` whose stand-in trtllm-serve refuses its "
        "file and exits before it binds: the warning is checked, nothing listens"
    ),
    ("tests/unit/test_bench_sandbox.py", "proxy.example"): (
        "an HTTPS_PROXY value the sandbox must strip from the child's environment; "
        "nothing connects (RFC 2606 .example never resolves)"
    ),
    **{
        (f, group): "a Kubernetes API group or resource name in a manifest field; no request"
        for f in ("tests/unit/test_deploy_k8s.py", "tests/fixtures/k8s_schemas.py")
        for group in (
            "leaderworkerset.x-k8s.io",
            "monitoring.coreos.com",
            "rbac.authorization.k8s.io",
            "nvidia.com",
        )
        if (f, group)
        not in {
            ("tests/unit/test_deploy_k8s.py", "monitoring.coreos.com"),
            ("tests/unit/test_deploy_k8s.py", "rbac.authorization.k8s.io"),
        }
    },
    ("tests/fixtures/k8s_schemas.py", "kubernetes.io"): (
        "the $id of the trimmed Kubernetes schema, resolved from tests/data; never fetched"
    ),
    ("tests/unit/test_deploy_k8s.py", "0.0.0.0"): (
        "the bind address written into a pod's tritonserver argv; asserted as text"
    ),
    **{
        (f, "registry.example.com"): (
            "an image name given to `deploy k8s --image`; nothing pulls (RFC 2606 example.com)"
        )
        for f in (
            "tests/unit/test_deploy_k8s.py",
            "tests/unit/test_deploy_cluster.py",
            "tests/unit/test_deploy_gateway.py",
        )
    },
    **{
        (f, "gateway.networking.k8s.io"): "the Gateway API group in a manifest field; no request"
        for f in ("tests/unit/test_deploy_gateway.py", "tests/fixtures/k8s_schemas.py")
    },
    ("tests/unit/test_deploy_dynamo.py", "nvidia.com"): (
        "a resource name (nvidia.com/gpu) in a generated graph; no request"
    ),
    ("tests/unit/test_deploy_dynamo.py", "trtspec.dev"): (
        "an annotation key prefix in a generated graph; no request"
    ),
    **{
        ("tests/unit/test_rollout_kube.py", address): (
            "the API server address kubelet gives a pod, turned into a URL and asserted as "
            "text; nothing connects"
        )
        for address in ("10.96.0.1", "fd00::1")
    },
    ("tests/unit/test_rollout_k8s.py", "registry.example.com"): (
        "an image name given to `deploy k8s --image`; nothing pulls (RFC 2606 example.com)"
    ),
    ("tests/unit/test_rollout_k8s.py", "rbac.authorization.k8s.io"): (
        "the API group of the rollout Role a RoleBinding names, asserted as text; no request"
    ),
    ("tests/unit/test_deploy_cluster.py", "nvidia.com"): (
        "a node label or taint key (nvidia.com/gpu...) in generated manifests; no request"
    ),
    ("tests/unit/test_deploy_k8s.py", "trtspec.dev"): (
        "a label/annotation key prefix in generated manifests; no request"
    ),
    ("tests/unit/test_routes_import.py", "github.com"): (
        "the source of a corpus sample named in a docstring; the test reads tests/data"
    ),
}

# Folders of data documents (JSON Schemas: $schema/$id URIs and example
# domains in field descriptions) that the tests load from disk and never
# resolve over the network → why.
ALLOWED_TREES: dict[str, str] = {
    "tests/data/deploy_schemas/": (
        "pinned Kubernetes/CRD JSON Schemas read from disk by a local validator; "
        "their URIs and example hosts are text, never fetched"
    ),
}

_IPV4 = re.compile(r"(?<![\w.])(\d{1,3}(?:\.\d{1,3}){3})(?![\w.])")
_IPV6 = re.compile(r"\[([0-9A-Fa-f:]*:[0-9A-Fa-f:.]*)\]|^([0-9A-Fa-f:]*::?[0-9A-Fa-f:]*)$")
_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://(\[[^\]]+\]|[^\s/:?#\"']+)", re.IGNORECASE)
# A dotted name ending in a top-level domain (or one reserved for examples).
_TLDS = (
    "com|org|net|io|ai|co|dev|app|cloud|edu|gov|info|biz|us|uk|de|fr|cn|jp|ru|"
    "example|test|invalid|local|internal|lan|corp|home"
)
_DOMAIN = re.compile(
    rf"(?<![\w.@/-])((?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.)+(?:{_TLDS}))(?![\w-])",
    re.IGNORECASE,
)
# Dotted names that look like domains but are Python modules or file names.
_NOT_HOSTS = re.compile(r"\.(?:py|json|yaml|yml|txt|md|html|jsonl|pbtxt|sse|safetensors)$")


def _is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def addresses(text: str) -> set[str]:
    """Every IP literal, URL host and domain name in ``text``."""
    found: set[str] = set(m.group(1) for m in _IPV4.finditer(text))
    found |= {m.group(1).strip("[]") for m in _URL.finditer(text)}
    found |= {m.group(1) for m in _DOMAIN.finditer(text) if not _NOT_HOSTS.search(m.group(1))}
    stripped = text.strip()
    for m in _IPV6.finditer(stripped):
        candidate = m.group(1) or m.group(2)
        try:
            ipaddress.IPv6Address(candidate)
        except ValueError:
            continue
        found.add(candidate)
    return {a for a in found if _valid(a)}


def _valid(address: str) -> bool:
    if _IPV4.fullmatch(address):
        try:
            ipaddress.IPv4Address(address)
        except ValueError:
            return False  # a version string such as 1.2.3.400
    return True


def _strings(path: Path) -> list[str]:
    if path.suffix != ".py":
        return [path.read_text(encoding="utf-8", errors="replace")]
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return [
        node.value if isinstance(node.value, str) else node.value.decode("latin-1")
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes))
    ]


def _sources() -> list[Path]:
    out = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            if path.suffix in (".py", ".txt", ".sse", ".json", ".jsonl", ".yaml", ".pbtxt"):
                out.append(path)
    return out


def test_the_scanner_finds_every_kind_of_address() -> None:
    """The scanner itself can fail: each kind of address is found, loopback is not flagged."""
    text = (
        "connect(('93.184.216.34', 80)); url = 'https://huggingface.co/org/m'; "
        "host gpu-box.example; ws://[2001:db8::1]:80/x"
    )
    assert addresses(text) == {
        "93.184.216.34",
        "huggingface.co",
        "gpu-box.example",
        "2001:db8::1",
    }
    assert addresses("::") == {"::"}
    assert addresses("version 1.2.3.400, config.json, trtspec.bench.runner") == set()
    loopback = addresses("http://127.0.0.1:8000 localhost [::1] 127.1.2.3")
    assert all(_is_loopback(a) for a in loopback), loopback


def test_tests_and_benchmarks_address_only_loopback() -> None:
    seen: set[tuple[str, str]] = set()
    seen_trees: set[str] = set()
    bad: list[str] = []
    for path in _sources():
        rel = str(path.relative_to(ROOT))
        if rel == "tests/unit/test_loopback_only.py":
            continue  # this file's own examples
        tree = next((t for t in ALLOWED_TREES if rel.startswith(t)), None)
        if tree is not None:
            seen_trees.add(tree)
            continue
        for text in _strings(path):
            for address in addresses(text):
                if _is_loopback(address):
                    continue
                for key in ((rel, address), ("*", address)):
                    if key in ALLOWED:
                        seen.add(key)
                        break
                else:
                    bad.append(f"{rel}: {address!r} in {text[:120]!r}")
                continue
    assert not bad, (
        "tests and benchmarks may address loopback only (127.0.0.1, ::1, localhost); "
        "use a loopback listener, or allow-list data that is never connected to, "
        "with the reason:\n" + "\n".join(sorted(set(bad)))
    )
    stale = sorted(set(ALLOWED) - seen) + sorted(set(ALLOWED_TREES) - seen_trees)
    assert not stale, f"allow-list entries that match nothing any more; delete them: {stale}"
