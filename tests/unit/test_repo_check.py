"""``trtspec repo --check`` (``trtspec.repo.check``) on an assembled
repository: what it accepts, and each kind of damage it reports; and the
orchestrator parameters it checks (draft schedule, ``stream_interval``) as
the assembler writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.fixtures.repo_build import (
    SPEC,
    assembled,
    build,
    edit,
    params,
    parse,
    write_engines,
    write_spec,
)

from trtspec.plan import make_plan
from trtspec.repo.assemble import assemble
from trtspec.repo.check import check_repository
from trtspec.spec import load_spec


@pytest.fixture
def built(tmp_path: Path):
    return build(tmp_path)


@pytest.fixture
def repo(built) -> Path:
    return assembled(built)


def test_assembled_repository_passes_check(repo: Path) -> None:
    assert check_repository(repo) == []


def test_check_rejects_a_renamed_tensor(repo: Path) -> None:
    config = repo / "target_dte" / "config.pbtxt"
    edit(config, 'name: "draft_input_ids"', 'name: "draft_ids"')
    assert [str(p) for p in check_repository(repo)] == [
        f"{config}: model target_dte has no input 'draft_input_ids' (draft sends it)",
        f"{config}: model target_dte has no input 'draft_input_ids' (ngram sends it)",
    ]


def test_check_rejects_a_missing_engine_folder(repo: Path, built) -> None:
    _, plan, engines, _ = built
    draft_engine = plan.variants["draft"].draft
    folder = (engines / "tiny-all" / draft_engine).resolve()
    for item in sorted(folder.rglob("*"), reverse=True):
        item.rmdir() if item.is_dir() else item.unlink()
    folder.rmdir()
    assert [str(p) for p in check_repository(repo)] == [
        f"{repo / draft_engine / 'config.pbtxt'}: gpt_model_path {folder} does not exist "
        f"(engine {draft_engine} is not built)"
    ]


def test_check_rejects_a_decoupled_engine_behind_a_draft_loop(repo: Path) -> None:
    config = repo / "target_dte" / "config.pbtxt"
    edit(
        config, "model_transaction_policy {\n}", "model_transaction_policy {\n  decoupled: true\n}"
    )
    fix = "set model_transaction_policy { decoupled: false }"
    assert [str(p) for p in check_repository(repo)] == [
        f"{config}: target_dte is decoupled but draft calls it in a draft loop with exec(); {fix}",
        f"{config}: target_dte is decoupled but ngram calls it in a draft loop with exec(); {fix}",
    ]


def test_check_rejects_unparseable_config_and_placeholders(repo: Path) -> None:
    (repo / "preprocessing" / "config.pbtxt").write_text("name: 'preprocessing'\nbogus: 1\n")
    edit(
        repo / "postprocessing" / "config.pbtxt",
        'name: "postprocessing"',
        'name: "postprocessing"\nmax_batch_size: ${triton_max_batch_size}',
    )
    problems = [str(p) for p in check_repository(repo)]
    pre = repo / "preprocessing" / "config.pbtxt"
    post = repo / "postprocessing" / "config.pbtxt"
    # folders are checked in name order: postprocessing first
    assert problems[0] == f"{post}: contains an unfilled ${{…}} template placeholder"
    assert problems[1].startswith(f"{pre}: not a valid ModelConfig: 2:1 : ")
    assert "bogus" in problems[1]
    # every orchestrator now calls two models that do not load
    assert (
        f"{repo / 'baseline' / 'config.pbtxt'}: parameter preprocessing_model: model "
        f"'preprocessing' does not exist in {repo}" in problems
    )


def test_check_rejects_engine_built_for_another_mode_or_shorter_drafts(repo: Path, built) -> None:
    _, _, engines, _ = built
    engine_json = (engines / "tiny-all" / "target_dte" / "config.json").resolve()
    document = json.loads(engine_json.read_text())
    document["build_config"].update(max_draft_len=2, speculative_decoding_mode=1)
    engine_json.write_text(json.dumps(document))
    config = repo / "target_dte" / "config.pbtxt"
    assert [str(p) for p in check_repository(repo)] == [
        f"{config}: engine target_dte is served as draft_tokens_external but {engine_json} "
        "has speculative_decoding_mode 1 (expected 2)",
        f"{config}: engine target_dte was built with max_draft_len 2, less than the 4 its "
        "caller drafts",
        f"{config}: engine target_dte was built with max_draft_len 2, less than the 3 its "
        "caller drafts",
    ]


def test_check_rejects_an_unknown_draft_schedule(repo: Path) -> None:
    config = repo / "ngram" / "config.pbtxt"
    edit(config, 'string_value: "adaptive"', 'string_value: "heuristic"')
    assert [str(p) for p in check_repository(repo)] == [
        f"{config}: parameter draft_schedule 'heuristic' is not one of "
        "constant, adaptive, confidence"
    ]


def test_check_reads_the_confidence_schedule(tmp_path: Path) -> None:
    text = SPEC.format(backend="reference", version="1.1.0").replace(
        "num_draft_tokens: [2, 3]}", "num_draft_tokens: [2, 3], draft_schedule: confidence}"
    )
    assert "draft_schedule: confidence" in text
    write_spec(tmp_path)
    (tmp_path / "spec.yaml").write_text(text, encoding="utf-8")
    spec = load_spec(tmp_path / "spec.yaml")
    plan = make_plan(spec, tmp_path / "engines")
    write_engines(plan)
    repo = assemble(spec, plan, tmp_path / "engines", tmp_path / "triton_repo")
    draft = repo / "draft" / "config.pbtxt"
    assert params(parse(draft))["draft_confidence_threshold"] == "0.4"
    assert check_repository(repo) == []
    edit(draft, 'string_value: "0.4"', 'string_value: "1.5"')
    ngram = repo / "ngram" / "config.pbtxt"
    edit(ngram, 'string_value: "adaptive"', 'string_value: "confidence"')
    assert sorted(str(p) for p in check_repository(repo)) == sorted(
        [
            f"{draft}: parameter draft_confidence_threshold '1.5' is not a number between "
            "0 and 1 (exclusive)",
            f"{ngram}: parameter draft_schedule 'confidence' reads a draft model's "
            "probabilities; mode ngram has none (use constant or adaptive)",
        ]
    )


def test_flow_stream_interval_reaches_every_orchestrator(tmp_path: Path) -> None:
    """The spec's ``flow.stream_interval`` is written into every orchestrator
    (baseline included) and nowhere else; 1, the default, writes nothing (a
    repository as before it); ``check`` refuses a value the model would."""
    write_spec(tmp_path)
    text = (tmp_path / "spec.yaml").read_text(encoding="utf-8")
    (tmp_path / "spec.yaml").write_text(
        text + "flow: {kind: engine, stream_interval: 4}\n", encoding="utf-8"
    )
    spec = load_spec(tmp_path / "spec.yaml")
    assert spec.flow.stream_interval == 4
    plan = make_plan(spec, tmp_path / "engines")
    write_engines(plan)
    repo = assemble(spec, plan, tmp_path / "engines", tmp_path / "triton_repo")
    written = {
        path.parent.name: params(parse(path))["stream_interval"]
        for path in repo.glob("*/config.pbtxt")
        if "stream_interval" in params(parse(path))
    }
    orchestrators = {"baseline", *(v.name for v in spec.variants)}
    assert written == dict.fromkeys(orchestrators, "4")
    assert check_repository(repo) == []
    config = repo / "baseline" / "config.pbtxt"
    edit(
        config,
        'key: "stream_interval"\n  value {\n    string_value: "4"',
        'key: "stream_interval"\n  value {\n    string_value: "0"',
    )
    assert [str(p) for p in check_repository(repo)] == [
        f"{config}: parameter stream_interval '0' is not a positive integer "
        "(the spec's flow.stream_interval; absent = 1)"
    ]


def test_the_default_stream_interval_writes_nothing(built) -> None:
    spec, plan, engines, out = built
    repo = assemble(spec, plan, engines, out)
    assert not [p for p in repo.glob("*/config.pbtxt") if "stream_interval" in p.read_text()]


def test_check_rejects_router_to_missing_variant(repo: Path) -> None:
    routing = repo / "router" / "routing.json"
    routing.write_text(
        json.dumps(
            {
                "schema_version": 1,
                "default_variant": "baseline",
                "routes": {"code": {"variant": "ngram2"}},
            }
        )
    )
    assert [str(p) for p in check_repository(repo)] == [
        f"{routing}: routes to variant 'ngram2', which the router's variants do not list"
    ]


def test_check_covers_engines_nobody_calls(repo: Path, built) -> None:
    _, _, engines, _ = built
    (repo / "spare").mkdir()
    text = (repo / "target" / "config.pbtxt").read_text().replace('name: "target"', 'name: "spare"')
    missing = engines.resolve() / "tiny-all" / "spare"
    text = text.replace(str(engines.resolve() / "tiny-all" / "target"), str(missing))
    (repo / "spare" / "config.pbtxt").write_text(text)
    (repo / "spare" / "1").mkdir()
    (repo / "spare" / "1" / "model.py").write_text("")
    assert [str(p) for p in check_repository(repo)] == [
        f"{repo / 'spare' / 'config.pbtxt'}: gpt_model_path {missing} does not exist "
        "(engine spare is not built)"
    ]


def test_check_of_the_parent_folder_points_to_the_repository(repo: Path) -> None:
    assert [str(p) for p in check_repository(repo.parent)] == [
        f"{repo.parent}: holds repositories, not models; check {repo}"
    ]


def test_check_of_a_missing_folder(tmp_path: Path) -> None:
    assert [str(p) for p in check_repository(tmp_path / "nope")] == [
        f"{tmp_path / 'nope'}: repository folder does not exist"
    ]
