"""Fingerprints and stale routing: a real reference build of the tiny model
(target, target_dte and a draft engine), a routing.yaml carrying the
fingerprint exactly as `trtspec bench` records it, then one thing changed at
a time — the draft's weights, the chat template, one route's prompts, the
sampling — and `trtspec repo --routing` must refuse with the exact message,
leave the installed routing table alone, and install with --accept-stale."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from tests.fixtures.every_mode import in_process_builds
from tests.fixtures.tiny_model import make_tiny_draft

from trtspec import fingerprint
from trtspec.bench.decide import routing_yaml
from trtspec.bench.runner import _fingerprint, plan_from_spec
from trtspec.cli.main import cli
from trtspec.spec import load_spec

SPEC = """\
name: fp
backend: reference
target: {{model: {target}, family: llama, max_batch_size: 2, max_input_len: 64, max_seq_len: 128}}
variants:
  - {{name: draft, mode: draft_model, draft: {{model: {draft}, family: llama}}, max_draft_len: 4,
     num_draft_tokens: [2]}}
  - {{name: ngram, mode: ngram, max_draft_len: 4}}
routes:
  code: {{prompts: routes/code.jsonl, max_tokens: 16}}
  chat: {{prompts: routes/chat.jsonl, max_tokens: 16}}
bench: {{temperatures: [0.0], top_p: 1.0}}
"""
ROUTING = {
    "schema_version": 1,
    "default_variant": "baseline",
    "routes": {
        "code": {
            "variant": "draft",
            "num_draft_tokens": 2,
            "canary_percent": 100,
            "decision": "promote",
            "fallback_variant": "baseline",
        },
        "chat": {"variant": "baseline", "decision": "inconclusive"},
    },
}


def run(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args))


@pytest.fixture(scope="module", autouse=True)
def _builds_in_process() -> Iterator[None]:
    """This module's ``trtspec build`` runs its reference steps in process."""
    with in_process_builds():
        yield


@pytest.fixture(scope="module")
def built(
    tmp_path_factory: pytest.TempPathFactory, tiny_llama: Path, tiny_draft: Path
) -> dict[str, Path]:
    """Engines built once for the module (three real reference builds)."""
    import shutil

    tmp_path = tmp_path_factory.mktemp("fp")
    target = shutil.copytree(tiny_llama, tmp_path / "target")
    draft = shutil.copytree(tiny_draft, tmp_path / "draft")
    (tmp_path / "routes").mkdir()
    spec_path = tmp_path / "fp.yaml"
    spec_path.write_text(SPEC.format(target=target, draft=draft))
    engines, output = tmp_path / "engines", tmp_path / "triton_repo"
    paths = {
        "spec": spec_path,
        "engines": engines,
        "output": output,
        "routing": tmp_path / "routing.yaml",
        "draft": draft,
        "target": target,
        "root": tmp_path,
    }
    _reset(paths)
    res = run("build", str(spec_path), "--engines", str(engines))
    assert res.exit_code == 0, res.output
    return paths


def _reset(paths: dict[str, Path]) -> None:
    root = paths["root"]
    (root / "routes" / "code.jsonl").write_text('{"prompt": "def add(a, b):\\n"}\n')
    (root / "routes" / "chat.jsonl").write_text(
        '{"messages": [{"role": "user", "content": "hi"}]}\n'
    )
    text = paths["spec"].read_text()
    paths["spec"].write_text(text.replace("top_p: 0.9", "top_p: 1.0"))


@pytest.fixture
def measured(built: dict[str, Path]) -> dict[str, Path]:
    """The module's engines as the previous test left them (a rebuilt engine
    stays rebuilt), its route and spec edits undone, an installed repository
    and the routing.yaml a bench run on them would write now."""
    _reset(built)
    res = run(
        "repo",
        str(built["spec"]),
        "--engines",
        str(built["engines"]),
        "--output",
        str(built["output"]),
    )
    assert res.exit_code == 0, res.output
    spec = load_spec(built["spec"])
    fp = _fingerprint(
        spec,
        plan_from_spec(spec, engines_root=built["engines"]),
        built["engines"],
        built["output"] / "fp",
    )
    assert fp is not None
    built["routing"].write_text(routing_yaml({**ROUTING, "fingerprint": fp}))
    return built


def install(paths: dict[str, Path], *extra: str) -> Any:
    return run(
        "repo",
        str(paths["spec"]),
        "--engines",
        str(paths["engines"]),
        "--output",
        str(paths["output"]),
        "--routing",
        str(paths["routing"]),
        *extra,
    )


def installed_routes(paths: dict[str, Path]) -> dict[str, Any]:
    table = json.loads((paths["output"] / "fp" / "router" / "routing.json").read_text())
    return dict(table["routes"])


def refused(paths: dict[str, Path], changes: list[str], command: str) -> None:
    """`repo --routing` exits 1 with exactly these changes and this command,
    and the router keeps the table it had; --accept-stale then installs."""
    before = installed_routes(paths)
    res = install(paths)
    assert res.exit_code == 1, res.output
    routing, spec = paths["routing"], paths["spec"]
    n = len(changes)
    assert res.stderr == (
        f"Error: {routing}: stale routing: {n} thing{'s' if n != 1 else ''} changed since "
        "it was measured:\n  " + "\n  ".join(changes) + "\n"
        f"Hint: re-measure just those cells with `trtspec bench {spec}{command}` and install "
        "that run's routing.yaml (compare the two runs with `trtspec compare`), or pass "
        "--accept-stale to install this one anyway; the repository keeps its current routing "
        "table until then.\n"
    )
    assert res.stdout == ""
    assert installed_routes(paths) == before
    res = install(paths, "--accept-stale")
    assert res.exit_code == 0, res.output
    assert res.stderr.startswith(
        "Warning: --accept-stale: installing stale routing: "
        f"{n} thing{'s' if n != 1 else ''} changed since it was measured:\n  "
        + "\n  ".join(changes)
        + "\n"
    )
    assert installed_routes(paths)["code"]["variant"] == "draft"


def test_fresh_routing_installs_and_carries_the_fingerprint(measured: dict[str, Path]) -> None:
    doc = yaml.safe_load(measured["routing"].read_text())
    fp = doc["fingerprint"]
    assert set(fp["engines"]) == {"target", "target_dte", "draft_draft"}
    assert fp["variants"]["draft"]["engines"] == ["target_dte", "draft_draft"]
    assert fp["variants"]["baseline"]["engines"] == ["target"]
    assert fp["engines"]["draft_draft"]["role"] == "draft"
    assert fp["engines"]["draft_draft"]["versions"]["torch"]
    assert fp["target"]["chat_template"] and fp["target"]["tokenizer"]
    assert fp["routes"]["code"] == {
        "prompts": fingerprint.file_hash(measured["root"] / "routes" / "code.jsonl"),
        "sampling": {
            "temperatures": [0.0],
            "top_p": 1.0,
            "top_k": 0,
            "seed": 1234,
            "max_tokens": 16,
        },
    }
    assert fp["repository"] == fingerprint.repository_hash(measured["output"] / "fp")
    assert fp["versions"] == {"tensorrt_llm": None, "tritonserver": None}
    res = install(measured)
    assert res.exit_code == 0, res.output
    assert "stale" not in res.stderr
    assert installed_routes(measured)["code"]["variant"] == "draft"


def test_rebuilt_draft_with_new_weights_is_refused(
    measured: dict[str, Path], tiny_llama: Path
) -> None:
    make_tiny_draft(tiny_llama, measured["draft"], seed=7)  # new weights, same folder
    res = run("build", str(measured["spec"]), "--engines", str(measured["engines"]))
    assert res.exit_code == 0, res.output
    built = json.loads((measured["engines"] / "fp" / "draft_draft" / "trtspec.json").read_text())
    day = built["built_at"][:10]
    refused(
        measured,
        [f"variant draft: draft engine draft_draft rebuilt {day} (weights changed)"],
        " --variants draft",
    )


def test_changed_chat_template_is_refused(measured: dict[str, Path]) -> None:
    # a new template in the target's model folder; the rebuild copies it into
    # the target engines' tokenizer/ (their weights stay the same)
    tok = measured["target"]
    files = [
        p
        for p in (tok / "chat_template.jinja", tok / "tokenizer_config.json")
        if p.is_file() and "message" in p.read_text()
    ]
    path = files[0]
    if path.suffix == ".jinja":
        path.write_text("SYSTEM: be terse.\n" + path.read_text())
    else:
        config = json.loads(path.read_text())
        config["chat_template"] = "SYSTEM: be terse.\n" + config["chat_template"]
        path.write_text(json.dumps(config))
    res = run("build", str(measured["spec"]), "--engines", str(measured["engines"]))
    assert res.exit_code == 0, res.output
    assert "reference engine target ..." in res.stderr  # rebuilt, not cached
    refused(measured, ["target chat template changed"], "")


def test_changed_prompts_of_one_route_are_refused(measured: dict[str, Path]) -> None:
    with open(measured["root"] / "routes" / "chat.jsonl", "a") as fh:
        fh.write('{"messages": [{"role": "user", "content": "and another"}]}\n')
    refused(measured, ["route chat: prompts changed"], " --routes chat")


def test_changed_sampling_is_refused(measured: dict[str, Path]) -> None:
    spec = measured["spec"]
    spec.write_text(spec.read_text().replace("top_p: 1.0", "top_p: 0.9"))
    refused(
        measured,
        [
            "route code: sampling changed (top_p 1 → 0.9)",
            "route chat: sampling changed (top_p 1 → 0.9)",
        ],
        " --routes chat,code",
    )


def test_fewer_temperatures_still_match_but_a_new_one_does_not() -> None:
    rec = {"temperatures": [0.0, 0.7], "top_p": 1.0, "top_k": 0, "max_tokens": 8}
    assert fingerprint._sampling_change(rec, {**rec, "temperatures": [0.0]}) == []
    assert fingerprint._sampling_change(rec, {**rec, "temperatures": [0.0, 1.0]}) == [
        "temperatures [0, 0.7] → [0, 1]"
    ]
    assert fingerprint._sampling_change(rec, {**rec, "seed": 9}) == []


def test_engine_reasons_name_argv_and_versions() -> None:
    old = {"steps": "a", "argv": "x", "versions": {"torch": "2.4"}, "id": "1"}
    assert fingerprint._engine_reason(old, {**old, "argv": "y", "steps": "b"}) == (
        "build argv changed"
    )
    assert fingerprint._engine_reason(old, {**old, "versions": {"torch": "2.5"}}) == (
        "tool versions changed: torch 2.4 → 2.5"
    )
    assert fingerprint._engine_reason(old, {**old, "steps": "b"}) == "weights changed"
    old = {**old, "tokenizer_files": "t", "weight_files": "w"}
    assert fingerprint._engine_reason(old, {**old, "steps": "b", "tokenizer_files": "u"}) == (
        "tokenizer files changed"
    )
    assert fingerprint._engine_reason(
        old, {**old, "steps": "b", "tokenizer_files": "u", "weight_files": "v"}
    ) == ("weights and tokenizer files changed")
    assert fingerprint._engine_reason(old, {**old, "steps": "b", "weight_files": "v"}) == (
        "weights changed"
    )


def test_routing_without_fingerprint_installs_with_a_warning(measured: dict[str, Path]) -> None:
    measured["routing"].write_text(routing_yaml(ROUTING))
    res = install(measured)
    assert res.exit_code == 0, res.output
    assert res.stderr.startswith(
        f"Warning: {measured['routing']} carries no fingerprint (not written by `trtspec "
        "bench`?), so it cannot be checked for staleness\n"
    )


def test_diff_lists_every_changed_leaf() -> None:
    a = {"routes": {"code": {"prompts": "1"}}, "versions": {"tritonserver": "2.51.0"}}
    b = {"routes": {"code": {"prompts": "2"}}, "versions": {"tritonserver": "2.52.0"}}
    assert fingerprint.diff(a, b) == [
        "routes.code.prompts: 1 → 2",
        "versions.tritonserver: 2.51.0 → 2.52.0",
    ]


def _fp(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "target": {"tokenizer": "t1", "chat_template": "c1"},
        "engines": {
            "target": {"role": "target", "id": "e1", "built_at": "2026-11-30T10:00:00Z"},
            "target_dte": {"role": "target", "id": "e2"},
            "draft_x": {"role": "draft", "id": "e3"},
        },
        "variants": {
            "baseline": {"engines": ["target"], "settings": "s0"},
            "draft": {"engines": ["target_dte", "draft_x"], "settings": "s1"},
        },
        "routes": {
            "code": {"prompts": "p1", "sampling": {"top_p": 1.0}},
            "chat": {"prompts": "p2", "sampling": {"top_p": 1.0}},
        },
    }
    for key, value in over.items():
        base[key] = value
    return base


def test_changes_scope_the_remeasure_command() -> None:
    old = _fp()
    engines = {
        **old["engines"],
        "target": {"role": "target", "id": "e9", "built_at": "2026-12-02T08:00:00Z", "steps": "z"},
    }
    found = fingerprint.changes(old, _fp(engines=engines))
    assert [c.text for c in found] == [
        "variant baseline: target engine target rebuilt 2026-12-02 (weights changed)"
    ]
    # the baseline moved: every variant and route is stale
    assert fingerprint.remeasure_command("s.yaml", found) == "trtspec bench s.yaml"
    variants = {
        **old["variants"],
        "draft": {"engines": ["target_dte", "draft_x"], "settings": "s2"},
    }
    routes = {**old["routes"], "code": {"prompts": "p9", "sampling": {"top_p": 1.0}}}
    found = fingerprint.changes(old, _fp(variants=variants, routes=routes))
    assert [c.text for c in found] == [
        "variant draft: variant settings in the spec changed",
        "route code: prompts changed",
    ]
    # a variant change and a route change: one bench covering both
    assert fingerprint.remeasure_command("s.yaml", found) == "trtspec bench s.yaml"
    assert fingerprint.remeasure_command("s.yaml", found[:1]) == (
        "trtspec bench s.yaml --variants draft"
    )
    assert fingerprint.remeasure_command("s.yaml", found[1:]) == (
        "trtspec bench s.yaml --routes code"
    )


def test_changes_for_removed_parts_and_unrecorded_tokenizer() -> None:
    old = _fp(target={"tokenizer": None, "chat_template": None})
    now = _fp(
        variants={"baseline": old["variants"]["baseline"]},
        routes={"code": old["routes"]["code"]},
        engines={**old["engines"], "draft_x": {"missing": True, "id": None}},
    )
    assert [c.text for c in fingerprint.changes(old, now)] == [
        "variant draft: no longer in the spec",
        "route chat: no longer in the spec",
    ]
    now = _fp(engines={**old["engines"], "draft_x": {"missing": True, "id": None}})
    assert [c.text for c in fingerprint.changes(old, now, routes=["code"])] == [
        "variant draft: draft engine draft_x not built"
    ]
