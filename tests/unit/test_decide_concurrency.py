"""Decisions per concurrency level: a variant that wins under light load but
not under heavy load is promoted only up to the load where it wins, that cap
goes into routing.yaml as the route's ``max_concurrency`` (read back by the
router's own loader), and the report shows speedup vs concurrency per route
(table in report.md/html, plot in plots/)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.unit.test_bench_summary import row

from trtspec.artifacts.routing import InFlight, canary_bucket, choose, load_routing
from trtspec.bench.decide import judge_arm
from trtspec.bench.report import render_run
from trtspec.bench.report_console import console_lines
from trtspec.bench.summary import DEFAULT_DECISION, build_summary

BASE = [100.0, 120.0, 90.0, 110.0, 105.0, 95.0, 115.0, 100.0]


def sweep_rows(speedups: dict[int, float], *, route: str = "rag", variant: str = "ngram"):
    """Baseline and variant rows at each concurrency level; the variant is
    ``speedups[c]`` times as fast at level c (±2% per prompt, so the CI is
    narrow but not zero)."""
    rows: list[dict[str, Any]] = []
    for conc, s in speedups.items():
        for i, lat in enumerate(BASE):
            jitter = 1.0 + (0.02 if i % 2 else -0.02)
            for r in (row(route, "baseline", i, lat), row(route, variant, i, lat / s * jitter)):
                r.update(load=f"concurrency={conc}", concurrency=conc)
                rows.append(r)
    return rows


def arm_decision(summary: dict[str, Any], variant: str = "ngram") -> dict[str, Any]:
    return next(d for d in summary["decisions"] if d["variant"] == variant)


def test_wins_at_1_loses_at_8_is_promoted_with_max_concurrency_1() -> None:
    summary = build_summary(sweep_rows({1: 1.5, 8: 0.6}), {})
    dec = arm_decision(summary)
    assert dec["decision"] == "promote"
    assert dec["max_concurrency"] == 1
    assert [(lvl["concurrency"], lvl["decision"]) for lvl in dec["levels"]] == [
        (1, "promote"),
        (8, "exclude"),
    ]
    assert dec["levels"][0]["speedup"]["point"] == pytest.approx(1.5, rel=0.01)
    assert dec["levels"][1]["speedup"]["ci_high"] < 1.0
    assert dec["reasons"][-1] == (
        "promoted up to concurrency 1 only: exclude at concurrency=8 "
        "(max_concurrency 1 in routing.yaml)"
    )
    assert any("concurrency=8 T=0: slower than baseline" in r for r in dec["reasons"])
    entry = summary["routing"]["routes"]["rag"]
    assert (entry["variant"], entry["decision"], entry["max_concurrency"]) == (
        "ngram",
        "promote",
        1,
    )
    lines = console_lines(summary)
    assert lines[0].endswith("→ promote up to concurrency 1")
    assert lines[1] == (
        "    at concurrency=8: speedup 0.60x [0.59, 0.61]  8 pairs  → exclude at this load"
    )


def test_wins_at_every_level_has_no_cap() -> None:
    summary = build_summary(sweep_rows({1: 1.5, 4: 1.3, 8: 1.2}), {})
    dec = arm_decision(summary)
    assert (dec["decision"], dec["max_concurrency"]) == ("promote", None)
    assert [lvl["decision"] for lvl in dec["levels"]] == ["promote"] * 3
    assert "max_concurrency" not in summary["routing"]["routes"]["rag"]
    lines = console_lines(summary)
    assert lines[0].endswith("→ promote")
    assert [line.split("→ ")[1] for line in lines[1:]] == ["promote at this load"] * 2


def test_loses_at_1_is_excluded() -> None:
    summary = build_summary(sweep_rows({1: 0.7, 8: 0.5}), {})
    dec = arm_decision(summary)
    assert (dec["decision"], dec["max_concurrency"]) == ("exclude", None)
    assert summary["routing"]["routes"]["rag"] == {"variant": "baseline", "decision": "exclude"}


def test_an_exclude_decided_at_a_higher_level_names_that_level() -> None:
    # undecided on a lone request, clearly slower at 8: the headline (level 1)
    # shows a speedup above 1, so the line says which level decided
    summary = build_summary(sweep_rows({1: 1.02, 8: 0.6}), {})
    dec = arm_decision(summary)
    assert [lvl["decision"] for lvl in dec["levels"]] == ["inconclusive", "exclude"]
    assert dec["decision"] == "exclude"
    lines = console_lines(summary)
    assert lines[0].endswith("→ exclude (decided at concurrency=8)")
    assert lines[1].endswith("→ exclude at this load")


def test_loses_at_1_wins_at_8_is_not_promoted() -> None:
    # nothing is promoted unless the lightest measured load wins too
    dec = arm_decision(build_summary(sweep_rows({1: 0.7, 8: 1.5}), {}))
    assert (dec["decision"], dec["max_concurrency"]) == ("exclude", None)


def test_an_undecided_level_caps_below_it_even_if_a_higher_one_wins() -> None:
    # conservative: the cap is the largest level with every lower level a promote
    summary = build_summary(sweep_rows({1: 1.5, 4: 1.02, 8: 1.4}), {})
    dec = arm_decision(summary)
    assert (dec["decision"], dec["max_concurrency"]) == ("promote", 1)
    assert [lvl["decision"] for lvl in dec["levels"]] == ["promote", "inconclusive", "promote"]
    assert summary["routing"]["routes"]["rag"]["max_concurrency"] == 1


def test_broken_output_at_a_higher_level_excludes_outright() -> None:
    rows = sweep_rows({1: 1.5, 8: 1.5})
    for r in rows:
        if r["variant"] == "ngram" and r["concurrency"] == 8:
            r["output_ids_hash"] = r["text_hash"] = f"other{r['sample_index']}"
    dec = arm_decision(build_summary(rows, {}))
    assert (dec["decision"], dec["max_concurrency"]) == ("exclude", None)


def test_single_level_runs_keep_their_old_verdicts() -> None:
    dec = arm_decision(build_summary(sweep_rows({1: 1.5}), {}))
    assert (dec["decision"], dec["max_concurrency"]) == ("promote", None)
    assert [lvl["concurrency"] for lvl in dec["levels"]] == [1]


def test_judge_arm_with_an_open_loop_cell_that_loses() -> None:
    d = dict(DEFAULT_DECISION)

    def cell(conc: int | None, s: float) -> dict[str, Any]:
        return {
            "load": f"concurrency={conc}" if conc else "rate=2/s",
            "concurrency": conc,
            "temperature": 0.0,
            "error_rate": 0.0,
            "quality_pass_rate": None,
            "baseline_quality_pass_rate": None,
            "equal_rate": 1.0,
            "speedup": {"point": s, "ci_low": s * 0.95, "ci_high": s * 1.05},
            "pairs": 8,
            "p95_latency_regression": 0.0,
        }

    verdict, _reasons, cap, _levels = judge_arm([cell(1, 1.5), cell(8, 0.6), cell(None, 0.6)], d)
    assert (verdict, cap) == ("exclude", None)
    verdict, _reasons, cap, _levels = judge_arm([cell(1, 1.5), cell(8, 0.6), cell(None, 1.5)], d)
    assert (verdict, cap) == ("promote", 1)


def test_routing_yaml_with_max_concurrency_goes_through_the_router_loader(tmp_path: Path) -> None:
    """The real chain: rows on disk → render_run → routing.yaml → the loader
    `trtspec repo --routing` and the router model use → the router's choice."""
    run = tmp_path / "run"
    run.mkdir()
    rows = sweep_rows({1: 1.5, 8: 0.6}) + sweep_rows({1: 1.3, 8: 1.2}, route="chat")
    (run / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = render_run(run)
    on_disk = json.loads((run / "summary.json").read_text())
    assert [lvl["decision"] for lvl in arm_decision(on_disk)["levels"]] == ["promote", "exclude"]
    assert yaml.safe_load((run / "routing.yaml").read_text()) == summary["routing"]
    table = load_routing(run / "routing.yaml")
    assert table.routes["rag"].variant == "ngram"
    assert table.routes["rag"].max_concurrency == 1
    assert table.routes["chat"].max_concurrency is None
    # the router serves one rag request on ngram; the second in flight goes to the fallback
    inflight = InFlight()
    # two request ids inside the route's canary share (5% by default)
    a, b = [i for i in (f"r{n}" for n in range(1000)) if canary_bucket(i) < 500][:2]
    assert table.routes["rag"].canary_percent == 5.0
    first = inflight.admit(table, "rag", choose(table, "rag", a))
    second = inflight.admit(table, "rag", choose(table, "rag", b))
    assert (first.variant, second.variant) == ("ngram", "baseline")
    # the report: a table and a plot per route that was measured at several levels
    md = (run / "report.md").read_text()
    assert "## Speedup vs concurrency" in md
    assert "| ngram | 1.50x [" in md
    assert "| promote up to concurrency 1 |" in md
    assert "![rag: speedup vs concurrency](plots/speedup_vs_concurrency_rag.png)" in md
    png = run / "plots" / "speedup_vs_concurrency_rag.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (run / "plots" / "speedup_vs_concurrency_chat.png").is_file()
    html = (run / "report.html").read_text()
    assert "<h2>Speedup vs concurrency</h2>" in html
    assert html.count("src='plots/speedup_vs_concurrency_rag.png'") == 1  # beside its table
    assert "src='plots/speedup.png'" in html


def test_report_without_a_sweep_has_no_concurrency_section(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    rows = sweep_rows({1: 1.5})
    (run / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    render_run(run, plots=False)
    assert "Speedup vs concurrency" not in (run / "report.md").read_text()
    assert "Speedup vs concurrency" not in (run / "report.html").read_text()


def test_a_route_can_sweep_its_own_concurrency_levels(tmp_path: Path) -> None:
    from trtspec.bench.runner import plan_from_spec
    from trtspec.spec.schema import Spec

    (tmp_path / "r.jsonl").write_text(json.dumps({"prompt": "def f():\n"}) + "\n")
    spec = Spec.model_validate(
        {
            "name": "s",
            "target": {"model": "m", "family": "llama"},
            "routes": {
                "sweep": {"prompts": "r.jsonl", "concurrency": [1, 8]},
                "plain": {"prompts": "r.jsonl"},
            },
            "bench": {"concurrency": [2]},
        }
    )
    spec._source_path = tmp_path / "s.yaml"
    plan = plan_from_spec(spec)
    loads = {r.name: [c for _, c, _ in plan.settings.loads(r.concurrency)] for r in plan.routes}
    assert loads == {"sweep": [1, 8], "plain": [2]}
    # --concurrency overrides every route's own levels
    plan = plan_from_spec(spec, concurrency=[4])
    loads = {r.name: [c for _, c, _ in plan.settings.loads(r.concurrency)] for r in plan.routes}
    assert loads == {"sweep": [4], "plain": [4]}


def test_a_route_can_be_measured_at_its_own_temperatures(tmp_path: Path) -> None:
    from trtspec import fingerprint
    from trtspec.bench.runner import plan_from_spec
    from trtspec.flows import make_plan
    from trtspec.spec.schema import Spec

    (tmp_path / "r.jsonl").write_text(json.dumps({"prompt": "def f():\n"}) + "\n")
    spec = Spec.model_validate(
        {
            "name": "s",
            "target": {"model": "m", "family": "llama"},
            "routes": {
                "sampled": {"prompts": "r.jsonl", "temperatures": [0.7]},
                "plain": {"prompts": "r.jsonl"},
            },
            "bench": {"temperatures": [0.0]},
        }
    )
    spec._source_path = tmp_path / "s.yaml"
    plan = plan_from_spec(spec)
    temps = {r.name: r.temperatures or plan.settings.temperatures for r in plan.routes}
    assert temps == {"sampled": [0.7], "plain": [0.0]}
    # --temperatures overrides every route's own
    plan = plan_from_spec(spec, temperatures=[0.0, 1.0])
    assert [r.temperatures for r in plan.routes] == [None, None]
    # the fingerprint records each route's own sampling, as the run measures it
    now = fingerprint.current(spec, make_plan(spec, tmp_path / "engines"), tokenizer_dir=None)
    assert now["routes"]["sampled"]["sampling"]["temperatures"] == [0.7]
    assert now["routes"]["plain"]["sampling"]["temperatures"] == [0.0]


def test_the_demo_spec_sweeps_concurrency_within_its_batch(tmp_path: Path) -> None:
    """`make demo` measures its routes at 1 and 8 in flight, and the engine
    can batch all 8 (max_batch_size). The spec is validated as shipped, in a
    copy of the tree whose model folder stands in for the one `make demo`
    fetches (a clean clone has no .cache/models yet)."""
    import shutil

    from trtspec.spec import load_spec

    root = Path(__file__).resolve().parents[2]
    shutil.copytree(root / "build_specs", tmp_path / "build_specs")
    model = tmp_path / ".cache" / "models" / "smollm2-135m-instruct"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"model_type": "llama"}')
    spec = load_spec(tmp_path / "build_specs" / "demo-cpu.yaml")
    sweeps = {name: r.concurrency for name, r in spec.routes.items() if r.concurrency}
    assert sweeps == {"json_fill": [1, 8], "rag_copy_heavy": [1, 8]}
    # and one route at the service's temperature as well (issue 26)
    sampled = {name: r.temperatures for name, r in spec.routes.items() if r.temperatures}
    assert sampled == {"json_fill_t07": [0.7]}
    assert spec.routes["json_fill_t07"].prompts == spec.routes["json_fill"].prompts
    assert spec.routes["json_fill_t07"].requests == 5  # its cost: at most 5 pairs
    assert spec.target.max_batch_size >= 8


def test_load_throughput_counts_every_arm_of_a_level_together() -> None:
    from trtspec.bench.report_tables import concurrency_table

    rows = []
    for conc, start_gap in ((1, 1.0), (8, 0.0)):
        for i in range(4):
            for variant in ("baseline", "ngram"):
                r = row("rag", variant, i, 1000.0, tokens=40)
                # level 1: one request after another (2 s per prompt);
                # level 8: all eight at once, ending together after 1 s
                r.update(
                    load=f"concurrency={conc}",
                    concurrency=conc,
                    send_time_unix=2000.0 * conc + (2 * i + (variant == "ngram")) * start_gap,
                )
                rows.append(r)
    rows.append({**rows[0], "warmup": True, "completion_tokens": 999})  # not counted
    summary = build_summary(rows, {})
    got = {t["concurrency"]: t for t in summary["load_throughput"]}
    assert got[1]["tokens_per_second"] == pytest.approx(8 * 40 / 8.0)
    assert got[8]["tokens_per_second"] == pytest.approx(8 * 40 / 1.0)
    assert got[8]["requests"] == 8
    headers, table = concurrency_table(summary, "rag")
    assert headers == ["arm", "concurrency=1", "concurrency=8", "decision"]
    assert table[0] == ["all arms: aggregate tok/s", "40.0", "320.0", ""]
    assert table[1] == ["baseline tok/s per request", "40.0", "40.0", ""]
    # the level held: one at a time at 1, the baseline's four at once at 8
    assert table[2] == ["baseline requests in flight (mean)", "1.0", "4.0", ""]


def test_a_bad_route_concurrency_names_file_line_and_field(tmp_path: Path) -> None:
    from trtspec.errors import SpecError
    from trtspec.spec import load_spec

    (tmp_path / "r.jsonl").write_text(json.dumps({"prompt": "x"}) + "\n")
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: s\ntarget: {model: m, family: llama}\n"
        "routes:\n  r:\n    prompts: r.jsonl\n    concurrency: [1, 0]\n"
    )
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert err.value.message == (
        f"{path}:6:22: routes.r.concurrency[1]: input should be greater than or equal to 1 (got 0)"
    )
