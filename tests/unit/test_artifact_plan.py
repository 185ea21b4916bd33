"""``engines/<spec>/plan.json`` (``trtspec.artifacts.plan``): what ``trtspec
build`` writes is, read back by a later stage, the plan ``make_plan`` made
(under whatever engines root the later stage is given), and a missing, old
or stale file is refused with the fix."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from tests.fixtures.repo_build import build as build_tiny

from trtspec.artifacts.plan import PLAN_FILE, plan_path, save_plan
from trtspec.cli.main import cli
from trtspec.errors import ArtifactError
from trtspec.flows import load_plan, stage_plan
from trtspec.plan import make_plan
from trtspec.spec import load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(
    p
    for p in (ROOT / "build_specs").glob("*.yaml")
    if not p.name.startswith(("demo-cpu", "specbench-cpu"))  # these need the demo model
)


def _example(path: Path):
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    data.pop("routes", None)  # only the benchmark reads them (and their prompt files)
    return parse_spec(data, str(path), source_path=path)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_the_written_plan_is_the_plan_under_any_engines_root(path: Path, tmp_path: Path) -> None:
    spec = _example(path)
    built = make_plan(spec, tmp_path / "built")
    assert save_plan(spec, built) == plan_path(spec.name, tmp_path / "built")
    assert load_plan(spec, tmp_path / "built") == built
    # a later stage given another root (the engines moved, or a relative path)
    moved = tmp_path / "elsewhere"
    (moved / spec.name).mkdir(parents=True)
    (moved / spec.name / PLAN_FILE).write_bytes(
        plan_path(spec.name, tmp_path / "built").read_bytes()
    )
    loaded, made = load_plan(spec, moved), make_plan(spec, moved)
    assert (loaded.root, loaded.engines, loaded.variants) == (
        made.root,
        made.engines,
        made.variants,
    )
    # every path moves; the cache keys stay those of the build (what was built)
    assert [replace(s, cache_key="") for s in loaded.steps] == [
        replace(s, cache_key="") for s in made.steps
    ]
    assert [s.cache_key for s in loaded.steps] == [s.cache_key for s in built.steps]


def test_the_rebase_moves_the_engine_folders(tmp_path: Path) -> None:
    spec, plan, engines, _ = build_tiny(tmp_path)
    moved = tmp_path / "moved"
    moved.mkdir()
    (engines / spec.name).rename(moved / spec.name)
    again = load_plan(spec, moved)
    assert {str(e.dir) for e in again.engines} == {
        str(moved / spec.name / e.name) for e in plan.engines
    }
    assert all(str(moved) in s.unit for s in again.steps)


def test_a_missing_plan_names_the_build(tmp_path: Path) -> None:
    spec, _, _, _ = build_tiny(tmp_path)
    with pytest.raises(ArtifactError) as info:
        load_plan(spec, tmp_path / "nothing", spec_path="s.yaml")
    assert f"{tmp_path / 'nothing' / spec.name / PLAN_FILE}: no build plan" in str(info.value)
    assert info.value.hint is not None and "`trtspec build s.yaml`" in info.value.hint


def test_a_stale_plan_is_refused_and_a_route_change_is_not(tmp_path: Path) -> None:
    spec, plan, engines, _ = build_tiny(tmp_path)
    source = Path(spec.source_path)
    text = source.read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    data["bench"] = {**(data.get("bench") or {}), "seed": 7}  # not a build input
    source.write_text(yaml.safe_dump(data), encoding="utf-8")
    again = load_spec(source)
    assert again.spec_hash != spec.spec_hash
    loaded = load_plan(again, engines)
    assert loaded.engines == plan.engines and loaded.spec_hash == again.spec_hash
    data["target"]["max_batch_size"] = 3
    source.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(ArtifactError) as info:
        load_plan(load_spec(source), engines, spec_path=source)
    assert "changed since `trtspec build` wrote this plan" in str(info.value)
    assert info.value.hint is not None and f"`trtspec build {source}`" in info.value.hint


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("{", "not a build plan"),
        ("[]", "not a build plan"),
        (json.dumps({"schema_version": 99}), "schema_version: 99 is not supported"),
        (json.dumps({"schema_version": 1}), "spec: written for spec None"),
    ],
)
def test_an_unreadable_or_old_plan_is_refused(tmp_path: Path, content: str, words: str) -> None:
    spec, _, engines, _ = build_tiny(tmp_path)
    plan_path(spec.name, engines).write_text(content, encoding="utf-8")
    with pytest.raises(ArtifactError, match=words):
        load_plan(spec, engines)


def test_plan_for_makes_the_plan_only_where_none_was_written(tmp_path: Path) -> None:
    spec, _, engines, _ = build_tiny(tmp_path)
    assert stage_plan(spec, tmp_path / "unbuilt") == make_plan(spec, tmp_path / "unbuilt")
    plan_path(spec.name, engines).write_text(json.dumps({"schema_version": 99}))
    with pytest.raises(ArtifactError):
        stage_plan(spec, engines)  # a written plan is read, never silently replaced


def test_cli_repo_refuses_a_stale_plan(tmp_path: Path) -> None:
    spec, _, engines, output = build_tiny(tmp_path)
    source = Path(spec.source_path)
    data = yaml.safe_load(source.read_text(encoding="utf-8"))
    data["target"]["max_batch_size"] = 3
    source.write_text(yaml.safe_dump(data), encoding="utf-8")
    result = CliRunner().invoke(
        cli, ["repo", str(source), "--engines", str(engines), "--output", str(output)]
    )
    assert result.exit_code == 1
    assert "build_inputs:" in result.stderr and f"trtspec build {source}" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (output / spec.name).exists()


def test_a_malformed_plan_is_refused_without_a_traceback(tmp_path: Path) -> None:
    spec, _, engines, _ = build_tiny(tmp_path)
    path = plan_path(spec.name, engines)
    doc = json.loads(path.read_text(encoding="utf-8"))
    del doc["plan"]["engines"][0]["mode"]
    path.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(ArtifactError, match=r"plan: malformed"):
        load_plan(spec, engines)
