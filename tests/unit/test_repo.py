"""trtspec.repo: assembling a repository from a spec + plan, the manifest, the
configs' protobuf round trip, `repo --check` and the `trtspec repo` command.

The engine folders here are written by the test (``config.json`` +
``tokenizer/``): the assembler only reads their metadata; serving real
reference engines is tests/integration/test_repo_served.py's job."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from google.protobuf import text_format
from tests.fixtures.repo_build import (
    assembled,
    build,
    edit,
    params,
    parse,
    write_engines,
    write_spec,
)
from tritonclient.grpc import model_config_pb2

from trtspec.artifacts.routing import RouteRule, RoutingTable
from trtspec.cli.main import cli
from trtspec.errors import RepoError
from trtspec.modes.base import choices_text
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


def test_assemble_writes_one_model_per_engine_and_variant(built) -> None:
    spec, plan, engines, output = built
    repo = assemble(spec, plan, engines, output)
    assert repo == output / "tiny-all"
    folders = sorted(p.name for p in repo.iterdir() if p.is_dir())
    assert folders == sorted(
        [
            "preprocessing",
            "postprocessing",
            "router",
            "baseline",
            "draft",
            "ngram",
            "medusa",
            "eagle",
            "lookahead",
            "target",
            "target_dte",
            plan.variants["draft"].draft,
            "target_medusa_medusa",
            "target_eagle_eagle",
            "target_lookahead_lookahead",
        ]
    )
    for engine in plan.engines:
        assert (repo / engine.name / "config.pbtxt").is_file()
    # nothing left behind by the atomic swap
    assert [p.name for p in output.iterdir()] == ["tiny-all"]


def test_every_config_round_trips_and_has_no_placeholder(built) -> None:
    spec, plan, engines, output = built
    repo = assemble(spec, plan, engines, output)
    for path in repo.glob("*/config.pbtxt"):
        text = path.read_text(encoding="utf-8")
        assert "${" not in text, path
        config = parse(path)
        assert config.name == path.parent.name
        assert text_format.MessageToString(config) == text


def test_engine_models_decoupled_only_when_streamed(built) -> None:
    spec, plan, engines, output = built
    repo = assemble(spec, plan, engines, output)
    decoupled = {
        e.name: parse(repo / e.name / "config.pbtxt").model_transaction_policy.decoupled
        for e in plan.engines
    }
    draft_engine = plan.variants["draft"].draft
    assert decoupled == {
        "target": True,
        "target_dte": False,
        draft_engine: False,
        "target_medusa_medusa": True,
        "target_eagle_eagle": True,
        "target_lookahead_lookahead": True,
    }


def test_reference_engine_model_parameters(built) -> None:
    spec, plan, engines, output = built
    repo = assemble(spec, plan, engines, output)
    config = parse(repo / "target_lookahead_lookahead" / "config.pbtxt")
    assert config.backend == "python"
    assert config.max_batch_size == 2
    assert [(g.count, g.kind) for g in config.instance_group] == [
        (2, model_config_pb2.ModelInstanceGroup.KIND_CPU)
    ]
    p = params(config)
    assert p["gpt_model_path"] == str(
        (engines / "tiny-all" / "target_lookahead_lookahead").resolve()
    )
    assert (
        p["lookahead_window_size"],
        p["lookahead_ngram_size"],
        p["lookahead_verification_set_size"],
    ) == ("2", "2", "2")
    assert p["decoding_mode"] == "lookahead"
    assert p["exclude_input_in_output"] == "true"
    # six engines share the GPU fraction
    assert p["kv_cache_free_gpu_mem_fraction"] == "0.15"
    # reuse off in the spec, but forced on for the draft loop's engines
    assert p["enable_kv_cache_reuse"] == "false"
    assert params(parse(repo / "target_dte" / "config.pbtxt"))["enable_kv_cache_reuse"] == "true"
    medusa = params(parse(repo / "target_medusa_medusa" / "config.pbtxt"))
    assert medusa["medusa_choices"] == "{0}, {0, 0}, {1}"
    model_py = (repo / "target" / "1" / "model.py").read_text(encoding="utf-8")
    assert "from trtspec.runtime.engine.triton_model import TritonPythonModel" in model_py


def test_a_loop_engine_built_shorter_lowers_the_orchestrators_input_length(built) -> None:
    """An engine built before the loop's rule (max_input_len below
    max_seq_len - 1): the orchestrator is told what it takes, so it finishes
    without drafts instead of failing mid-stream."""
    spec, plan, engines, output = built
    config = Path(plan.engine("target_dte").dir) / "config.json"
    document = json.loads(config.read_text(encoding="utf-8"))
    document["build_config"]["max_input_len"] = 200
    config.write_text(json.dumps(document), encoding="utf-8")
    repo = assemble(spec, plan, engines, output)
    assert params(parse(repo / "ngram" / "config.pbtxt"))["max_input_len"] == "200"
    assert params(parse(repo / "draft" / "config.pbtxt"))["max_input_len"] == "200"
    assert "max_input_len" not in params(parse(repo / "baseline" / "config.pbtxt"))


def test_orchestrators_carry_their_callees(built) -> None:
    spec, plan, engines, output = built
    repo = assemble(spec, plan, engines, output)
    draft = params(parse(repo / "draft" / "config.pbtxt"))
    assert draft == {
        "variant": "draft",
        "mode": "draft_model",
        "preprocessing_model": "preprocessing",
        "postprocessing_model": "postprocessing",
        "target_model": "target_dte",
        "draft_model": plan.variants["draft"].draft,
        "seed_input": "seed",
        "perf_metrics": "true",
        "reuse_stats_input": "return_perf_metrics",
        "max_draft_len": "4",
        "num_draft_tokens": "3",
        "draft_schedule": "constant",
        "use_draft_logits": "false",
        "tokens_per_block": str(spec.target.kv_cache.tokens_per_block),
        # the orchestrator tokenizes and detokenizes in process (LocalText)
        "tokenizer_dir": str(engines.resolve() / "tiny-all" / "target" / "tokenizer"),
        # the baseline's limits, and the input length the loop's engines take
        # (max_seq_len - 1: every round re-sends prompt + output)
        "max_prompt_len": "256",
        "max_seq_len": "512",
        "max_input_len": "511",
        "clamp_max_tokens": "false",
    }
    ngram = params(parse(repo / "ngram" / "config.pbtxt"))
    assert (
        ngram["mode"],
        ngram["max_draft_len"],
        ngram["num_draft_tokens"],
        ngram["max_matching_ngram_size"],
        ngram["draft_schedule"],
    ) == ("ngram", "3", "3", "2", "adaptive")
    assert "draft_schedule" not in params(parse(repo / "medusa" / "config.pbtxt"))
    assert "draft_model" not in ngram
    baseline = parse(repo / "baseline" / "config.pbtxt")
    assert baseline.model_transaction_policy.decoupled is True
    assert baseline.max_batch_size == 0
    assert params(baseline)["target_model"] == "target"
    assert [t.name for t in baseline.output][:3] == ["text_output", "output_ids", "is_final"]


def test_manifest_lists_roles_calls_and_variants(built) -> None:
    spec, plan, engines, output = built
    repo = assemble(spec, plan, engines, output)
    manifest = json.loads((repo / "trtspec-repo.json").read_text(encoding="utf-8"))
    assert manifest["schema_version"] == 1
    assert manifest["spec"] == "tiny-all"
    assert manifest["spec_hash"] == spec.spec_hash
    assert manifest["backend"] == "reference"
    assert manifest["variants"] == ["draft", "eagle", "lookahead", "medusa", "ngram", "baseline"]
    draft_engine = plan.variants["draft"].draft
    assert manifest["models"]["draft"] == {
        "role": "orchestrator",
        "calls": ["preprocessing", "postprocessing", "target_dte", draft_engine],
        "variant": "draft",
        "mode": "draft_model",
    }
    assert manifest["models"]["router"]["calls"] == sorted(plan.variants)
    assert manifest["models"]["target_lookahead_lookahead"]["role"] == "engine"


def test_routing_table_is_written_for_the_router(built) -> None:
    spec, plan, engines, output = built
    table = RoutingTable("baseline", {"code": RouteRule("ngram", 2, 25.0, "promote")})
    repo = assemble(spec, plan, engines, output, routing=table)
    written = json.loads((repo / "router" / "routing.json").read_text(encoding="utf-8"))
    assert written == {
        "schema_version": 1,
        "default_variant": "baseline",
        "routes": {
            "code": {
                "variant": "ngram",
                "num_draft_tokens": 2,
                "canary_percent": 25.0,
                "decision": "promote",
                "fallback_variant": "baseline",
            }
        },
    }


def test_routing_to_an_unknown_variant_is_rejected(built) -> None:
    spec, plan, engines, output = built
    table = RoutingTable("baseline", {"code": RouteRule("medusa2")})
    with pytest.raises(RepoError) as info:
        assemble(spec, plan, engines, output, routing=table)
    assert info.value.message == (
        "routing: variant 'medusa2' is not in spec tiny-all "
        "(variants: baseline, draft, eagle, lookahead, medusa, ngram)"
    )
    assert not output.exists() or not any(output.iterdir())


def test_missing_engine_is_reported_before_writing(tmp_path: Path) -> None:
    spec = load_spec(write_spec(tmp_path))
    engines = tmp_path / "engines"
    plan = make_plan(spec, engines)
    write_engines(plan, skip=("target_dte",))
    with pytest.raises(RepoError) as info:
        assemble(spec, plan, engines, tmp_path / "out")
    path = (engines / "tiny-all" / "target_dte" / "config.json").resolve()
    assert info.value.message == f"{path}: engine target_dte is not built"
    assert info.value.hint == "Run `trtspec build` for this spec first, or pass --engines DIR."


def test_reassembly_replaces_the_old_repository_whole(built) -> None:
    spec, plan, engines, output = built
    repo = assemble(spec, plan, engines, output)
    (repo / "stale_model").mkdir()
    again = assemble(spec, plan, engines, output)
    assert again == repo
    assert not (repo / "stale_model").exists()
    assert sorted(p.name for p in output.iterdir()) == ["tiny-all"]


def test_failed_assembly_keeps_the_previous_repository(built, monkeypatch) -> None:
    spec, plan, engines, output = built
    repo = assemble(spec, plan, engines, output)
    before = (repo / "trtspec-repo.json").read_text(encoding="utf-8")
    from trtspec.repo import assemble as assemble_module

    def explode(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(assemble_module, "orchestrator_config", explode)
    with pytest.raises(KeyboardInterrupt):
        assemble(spec, plan, engines, output)
    assert (repo / "trtspec-repo.json").read_text(encoding="utf-8") == before
    assert sorted(p.name for p in output.iterdir()) == ["tiny-all"]


def test_old_versions_use_old_tensor_names(tmp_path: Path) -> None:
    spec = load_spec(write_spec(tmp_path, backend="tensorrt_llm", version="0.19.0"))
    engines = tmp_path / "engines"
    plan = make_plan(spec, engines)
    write_engines(plan)
    repo = assemble(spec, plan, engines, tmp_path / "out")
    config = parse(repo / "target" / "config.pbtxt")
    names = [t.name for t in config.input]
    assert "random_seed" in names and "min_length" in names
    assert "seed" not in names and "min_tokens" not in names
    assert config.backend == "tensorrtllm"
    assert params(parse(repo / "baseline" / "config.pbtxt"))["seed_input"] == "random_seed"
    assert check_repository(repo) == []


def test_kv_reuse_outputs_before_0_19(tmp_path: Path) -> None:
    """tensorrtllm_backend v0.17.0 / v0.18.x templates: the kv_cache_* outputs
    exist, asked for with return_kv_cache_reuse_stats (return_perf_metrics,
    with timing and acceptance, arrives in v0.19.0)."""
    path = write_spec(tmp_path, backend="tensorrt_llm", version="0.18.2")
    text = path.read_text(encoding="utf-8")  # lookahead needs 0.19
    path.write_text("\n".join(x for x in text.splitlines() if "lookahead" not in x) + "\n")
    spec = load_spec(path)
    engines = tmp_path / "engines"
    plan = make_plan(spec, engines)
    write_engines(plan)
    repo = assemble(spec, plan, engines, tmp_path / "out")
    config = parse(repo / "target_dte" / "config.pbtxt")
    names = {t.name for t in config.input}
    assert "return_kv_cache_reuse_stats" in names and "return_perf_metrics" not in names
    assert {t.name for t in config.output} >= {"kv_cache_reused_blocks"}
    assert "acceptance_rate" not in {t.name for t in config.output}
    # instances: 2 at tp 1: one GPU each (plan.placement)
    assert params(config)["gpu_device_ids"] == "0;1"
    orchestrator = params(parse(repo / "draft" / "config.pbtxt"))
    assert (orchestrator["perf_metrics"], orchestrator["reuse_stats_input"]) == (
        "false",
        "return_kv_cache_reuse_stats",
    )
    assert check_repository(repo) == []


def test_choices_text_format() -> None:
    assert choices_text([[0], [0, 0], [1, 2]]) == "{0}, {0, 0}, {1, 2}"


# -- CLI ------------------------------------------------------------------------


def test_cli_repo_builds_and_lists_models(built) -> None:
    spec, _, engines, output = built
    result = CliRunner().invoke(
        cli,
        [
            "repo",
            str(spec.source_path),
            "--engines",
            str(engines),
            "--output",
            str(output),
            "--format",
            "json",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["repository"] == str(output / "tiny-all")
    assert "router" in data["models"] and "baseline" in data["models"]
    assert result.stderr == f"Assembling {output / 'tiny-all'} from {engines / 'tiny-all'} …\n"


def test_cli_repo_with_routing_file(built, tmp_path: Path) -> None:
    spec, _, engines, output = built
    routing = tmp_path / "routing.yaml"
    routing.write_text(
        "schema_version: 1\ndefault_variant: baseline\nroutes:\n"
        "  code: {variant: ngram, num_draft_tokens: 2}\n"
    )
    result = CliRunner().invoke(
        cli,
        [
            "repo",
            str(spec.source_path),
            "--engines",
            str(engines),
            "--output",
            str(output),
            "--routing",
            str(routing),
        ],
    )
    assert result.exit_code == 0, result.output
    written = json.loads((output / "tiny-all" / "router" / "routing.json").read_text())
    # canary_percent omitted in the file: the spec's rollout (50) applies
    assert written["routes"]["code"]["canary_percent"] == 50.0
    assert re.search(r"^router +\S+router/config.pbtxt$", result.stdout, re.M)


def test_cli_repo_missing_engines_is_a_clean_error(tmp_path: Path) -> None:
    spec_path = write_spec(tmp_path)
    result = CliRunner().invoke(
        cli,
        [
            "repo",
            str(spec_path),
            "--engines",
            str(tmp_path / "none"),
            "--output",
            str(tmp_path / "o"),
        ],
    )
    assert result.exit_code == 1
    assert result.stdout == ""
    # nothing built there: no plan.json, the first file `trtspec build` writes
    plan = tmp_path / "none" / "tiny-all" / "plan.json"
    assert result.stderr.splitlines()[-2:] == [
        f"Error: {plan}: no build plan: the engines of spec tiny-all were not built here",
        f"Hint: run `trtspec build {spec_path}` (cached steps are skipped; it writes "
        "plan.json), or pass --engines DIR with the folder they were built in",
    ]
    assert "Traceback" not in result.stderr


def test_cli_check_ok(repo: Path) -> None:
    result = CliRunner().invoke(cli, ["repo", "--check", str(repo)])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"OK: {repo} (15 models)\n"
    assert result.stderr == ""


def test_cli_check_reports_every_problem(repo: Path) -> None:
    config = repo / "target_dte" / "config.pbtxt"
    edit(config, 'name: "draft_input_ids"', 'name: "draft_ids"')
    result = CliRunner().invoke(cli, ["repo", "--check", str(repo)])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == (
        f"Error: 2 problems in repository {repo}:\n"
        f"  {config}: model target_dte has no input 'draft_input_ids' (draft sends it)\n"
        f"  {config}: model target_dte has no input 'draft_input_ids' (ngram sends it)\n"
        "Hint: Fix each file named above, or regenerate the repository with "
        "`trtspec repo SPEC`.\n"
    )


def test_cli_repo_on_a_folder_without_check_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["repo", str(tmp_path)])
    assert result.exit_code == 2
    assert f"{tmp_path} is a folder; pass a spec file, or add --check" in result.stderr
    assert result.stdout == ""


def test_generated_model_py_files_import_existing_modules(repo: Path) -> None:
    import importlib.util

    modules = set()
    for model_py in repo.glob("*/1/model.py"):
        text = model_py.read_text()
        compile(text, str(model_py), "exec")
        modules.update(re.findall(r"^\s*from (\S+) import TritonPythonModel$", text, re.M))
    assert modules == {
        f"trtspec.runtime.models.{m}"
        for m in ("preprocessing", "postprocessing", "orchestrator", "router")
    } | {"trtspec.runtime.engine.triton_model"}
    for module in modules:
        assert importlib.util.find_spec(module) is not None, module


def test_cli_check_catches_a_deleted_engine_file(repo: Path, built) -> None:
    # An engine folder as `trtspec build` leaves it: weights plus a manifest
    # recording each file (issue 10, D10).
    from trtspec.integrity import file_records

    _, plan, _, _ = built
    engine = next(e for e in plan.engines if e.name == "target")
    folder = Path(engine.dir)
    (folder / "rank0.safetensors").write_bytes(b"\0" * 64)
    manifest = {
        "schema_version": 2,
        "spec": "tiny-all",
        "engine": engine.to_dict(),
        "files": file_records(folder),
    }
    (folder / "trtspec.json").write_text(json.dumps(manifest))
    assert check_repository(repo) == []
    (folder / "rank0.safetensors").unlink()
    result = CliRunner().invoke(cli, ["repo", "--check", str(repo)])
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: 1 problem in repository {repo}:\n"
        f"  {folder / 'rank0.safetensors'}: missing (engine target; recorded in "
        f"{folder / 'trtspec.json'}); rebuild it: `trtspec build SPEC --force --only "
        f"{engine.variants[0]}` (SPEC: the spec file of 'tiny-all')\n"
        "Hint: Fix each file named above, or regenerate the repository with "
        "`trtspec repo SPEC`.\n"
    )


# -- the benchmark's parity copy (bench/parity.py) -----------------------------


def test_parity_copy_gives_each_arm_its_own_shared_engine_models(built) -> None:
    from trtspec.bench.parity import parity_repo, shared_engines
    from trtspec.bench.plan import arms_for

    spec, plan, engines, output = built
    spec = load_spec(write_spec(output.parent, backend="tensorrt_llm"))
    plan = make_plan(spec, engines)
    repo = assemble(spec, plan, engines, output)
    arms = arms_for(spec.variants)
    labels = [a.label for a in arms]
    assert labels[:4] == ["baseline", "draft(k=2)", "draft(k=3)", "ngram(k=3)"]
    draft_engine = plan.variants["draft"].draft
    # target (baseline) has reuse off in this spec; the draft loop's engines have it on
    assert shared_engines(repo, arms) == {
        "target_dte": ["draft(k=2)", "draft(k=3)", "ngram(k=3)"],
        draft_engine: ["draft(k=2)", "draft(k=3)"],
    }
    before = float(
        params(parse(repo / "target" / "config.pbtxt"))["kv_cache_free_gpu_mem_fraction"]
    )
    n_before = sum(1 for e in plan.engines)
    copy = output.parent / "copy"
    got = parity_repo(repo, arms, copy)
    assert [a.model for a in got[:4]] == ["baseline", "draft", "draft__arm2", "ngram__arm3"]
    assert got[4:] == arms[4:]  # medusa, eagle, lookahead own their engines
    draft2 = params(parse(copy / "draft__arm2" / "config.pbtxt"))
    assert (draft2["target_model"], draft2["draft_model"]) == (
        "target_dte__arm2",
        f"{draft_engine}__arm2",
    )
    assert params(parse(copy / "ngram__arm3" / "config.pbtxt"))["target_model"] == (
        "target_dte__arm3"
    )
    dte3 = parse(copy / "target_dte__arm3" / "config.pbtxt")
    assert dte3.name == "target_dte__arm3"
    assert (
        params(dte3)["gpt_model_path"]
        == params(parse(repo / "target_dte" / "config.pbtxt"))["gpt_model_path"]
    )  # same engine folder, its own KV pool
    # the GPU's KV fraction is split over every engine model, copies included
    fractions = {
        p.parent.name: float(params(parse(p))["kv_cache_free_gpu_mem_fraction"])
        for p in copy.glob("*/config.pbtxt")
        if "kv_cache_free_gpu_mem_fraction" in params(parse(p))
    }
    assert len(fractions) == n_before + 3
    assert sum(fractions.values()) == pytest.approx(before * n_before, abs=1e-3)
    manifest = json.loads((copy / "trtspec-repo.json").read_text())
    assert manifest["models"]["ngram__arm3"]["calls"] == [
        "preprocessing",
        "postprocessing",
        "target_dte__arm3",
    ]
    assert manifest["models"]["ngram__arm3"]["variant"] == "ngram"
    assert check_repository(copy) == []
    # the source repository is untouched
    assert not (repo / "target_dte__arm2").exists()


def test_router_instances_set_the_routers_instance_group(built) -> None:
    from trtspec.spec.schema import Router

    spec, plan, engines, output = built
    one = parse(assemble(spec, plan, engines, output) / "router" / "config.pbtxt")
    assert [(g.count, g.kind) for g in one.instance_group] == [(1, 2)]  # 2: KIND_CPU
    three = spec.model_copy(update={"router": Router(instances=3)})
    repo = assemble(three, plan, engines, output)
    config = parse(repo / "router" / "config.pbtxt")
    assert [(g.count, g.kind) for g in config.instance_group] == [(3, 2)]
    # only the router: the other models keep theirs
    assert [g.count for g in parse(repo / "baseline" / "config.pbtxt").instance_group] == [1]
