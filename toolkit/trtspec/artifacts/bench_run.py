"""The files of one benchmark run folder (``bench_results/<spec>-<time>/``):
``run.json`` (what ran: spec, server, fingerprint; written first, completed
at the end), ``requests.jsonl`` (one row per measured request, schema
``REQUEST_SCHEMA_VERSION``; its row is ``RequestRow``, written and read by
``trtspec.bench.records``), ``summary.json`` (per-cell statistics and the
decisions, schema ``SUMMARY_SCHEMA_VERSION``; the document is ``Summary``,
built by ``trtspec.bench.summary``, saved and loaded here, read by ``trtspec
compare`` and ``trtspec deploy``) and ``routing.yaml``
(``trtspec.artifacts.routing``). Their names, schema versions and typed
shapes live here. The types are ``TypedDict``s: the files hold plain JSON
objects, so the typed form *is* the file's form (no conversion step that
could change a byte), and mypy checks every key a reader uses.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NotRequired, TypedDict, cast

from trtspec import fsutil
from trtspec.artifacts.routing import RoutingDocument
from trtspec.errors import BenchError

RUN_FILE = "run.json"
REQUESTS_FILE = "requests.jsonl"
REQUEST_SCHEMA_VERSION = 1
SUMMARY_FILE = "summary.json"
SUMMARY_SCHEMA_VERSION = 1

#: Opaque JSON carried through unchanged (run.json's sections, the settings).
JSONObject = dict[str, Any]

#: ``decision.objectives``: latency bounds by name (ttft_ms, itl_ms, latency_ms).
Objectives = Mapping[str, float | None]


class DecisionRules(TypedDict, total=False):
    """The spec's ``decision`` section as ``summary.json`` settings hold it
    (defaults filled in: trtspec.spec.schema.Decision)."""

    min_speedup: float
    max_p95_regression: float
    min_quality_pass_rate: float
    min_equal_rate: float
    max_error_rate: float
    min_pairs: int
    objectives: dict[str, float | None] | None
    decide_by: str


class RequestRow(TypedDict, total=False):
    """One line of ``requests.jsonl`` (None where not applicable). Rows of
    older runs may lack later keys, so readers use ``.get``."""

    schema_version: int
    run_id: str
    seq: int
    warmup: bool
    route: str
    prompt_index: int
    sample_index: int | None
    variant: str
    model: str | None
    mode: str | None
    speculative: bool
    draft_model: str | None
    num_speculative_tokens: int | None
    temperature: float | None
    top_p: float | None
    top_k: int | None
    seed: int | None
    max_tokens: int | None
    load: str
    concurrency: int | None
    request_rate: float | None
    request_id: str
    send_time_unix: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    ttft_ms: float | None
    latency_ms: float | None
    tpot_ms: float | None
    tokens_per_second: float | None
    accepted_tokens: int | None
    draft_tokens: int | None
    rounds: int | None
    server_ttft_ms: float | None
    prefix_reused_tokens: int | None
    server_total_ms: float | None
    served_variant: str | None
    fallback: bool | None
    error: str | None
    incident: str | None
    text_hash: str
    output_ids_hash: str | None
    first_token: int | None
    output_text: str
    quality: dict[str, dict[str, Any]] | None
    client_overhead_ms: float | None
    client_overhead_wall_ms: float | None
    send_lag_ms: float | None
    responses: int
    # external (OpenAI-compatible) arms: arm_kind triton|openai, the arm a row
    # pairs with, and where draft/accepted counts came from (response|metrics|null)
    arm_kind: str
    pairs_with: str | None
    acceptance_source: str | None
    acceptance_note: str | None
    accepted_per_position: dict[str, int] | None
    drafted_per_position: dict[str, int] | None
    finish_reason: str | None


class Change(TypedDict):
    """A paired figure with its interval."""

    point: float
    ci_low: float
    ci_high: float


class Interval(Change):
    """A paired estimate: the speedup (geometric mean of baseline/variant ms
    per output token, bench/sequential.py) and the paired differences."""

    pairs: int
    confidence: float


class PairedDifference(Interval):
    """Variant share − baseline share of a yes/no outcome (stats.py)."""

    table: dict[str, int]


class Distribution(TypedDict):
    p50: float | None
    p95: float | None
    p99: float | None
    mean: float | None
    min: float | None
    max: float | None


class Throughput(TypedDict, total=False):
    p50: float | None
    mean: float | None
    aggregate: float | None


class Goodput(TypedDict):
    objectives: dict[str, float]
    requests: int
    met: int
    share: float
    requests_per_second: float | None
    tokens_per_second: float | None


class DistributionTest(TypedDict):
    statistic: float
    dof: int
    p_value: float
    samples: list[int]


class PositionRate(TypedDict):
    position: int
    drafted: int
    accepted: int
    rate: float | None


class Unpaired(TypedDict):
    baseline_only: list[Any]
    variant_only: list[Any]


class Cell(TypedDict):
    """One route × variant × k × load × temperature cell of ``summary.json``
    (bench/metrics.py names what each figure measures)."""

    route: str
    variant: str
    model: str | None
    mode: str | None
    speculative: bool
    draft_model: str | None
    num_speculative_tokens: int | None
    arm_kind: str
    pairs_with: str | None
    acceptance_source: str | None
    acceptance_note: str | None
    load: str
    concurrency: int | None
    request_rate: float | None
    temperature: float
    count: int
    errors: int
    error_rate: float | None
    incidents: int
    ttft_ms: Distribution
    latency_ms: Distribution
    tpot_ms: Distribution
    tokens_per_second: Throughput
    inflight_mean: float | None
    prompt_tokens_mean: float | None
    completion_tokens_median: float | None
    short_output: bool
    draft_tokens: int | None
    accepted_tokens: int | None
    rounds: int | None
    acceptance_rate: float | None
    mean_accepted_length: float | None
    fallbacks: int
    quality_pass_rate: float | None
    quality_judged: int
    quality: dict[str, dict[str, int]]
    speedup: Interval | None
    pairs: int
    unpaired: int | None
    unpaired_samples: Unpaired | None
    equal_rate: float | None
    p95_latency_regression: float | None
    baseline_quality_pass_rate: float | None
    server_memory_bytes: int | None
    prefix_reused_tokens_mean: float | None
    cache_state_differs: int | None
    position_acceptance: list[PositionRate] | None
    goodput: Goodput | None
    goodput_difference: PairedDifference | None
    distribution_test: DistributionTest | None
    quality_difference: PairedDifference | None
    # present only where they apply
    cache_state_differs_samples: NotRequired[list[Any]]
    server_memory_kind: NotRequired[str | None]
    stop: NotRequired[str | None]  # faster | slower | undecided (sampled until decided)
    pairs_sent: NotRequired[int | None]


class Level(TypedDict):
    """One closed-loop level of an arm's decision (its worst temperature)."""

    concurrency: int
    decision: str
    speedup: Interval | None
    pairs: int
    goodput_difference: PairedDifference | None


class Headline(TypedDict):
    """The cell the console line shows, with every claim from one paired estimate."""

    load: str
    temperature: float
    baseline_tokens_per_second: float | None
    speedup: Interval | None
    tokens_per_second_change: Change | None
    latency_change: Change | None
    pairs: int
    quality_pass_rate: float | None
    baseline_quality_pass_rate: float | None
    equal_rate: float | None
    goodput: Goodput | None
    baseline_goodput: Goodput | None
    goodput_difference: PairedDifference | None


class Decision(TypedDict):
    """One (route, variant, k) verdict (bench/decide.py)."""

    route: str
    variant: str
    num_speculative_tokens: int | None
    decision: str  # promote | exclude | inconclusive
    reasons: list[str]
    short_output: bool
    baseline: str | None
    arm_kind: str
    min_speedup_point: float | None
    max_concurrency: int | None
    levels: list[Level]
    broken_output: bool
    temperatures: list[float]
    best_k: bool
    headline: Headline


class SequentialStop(TypedDict):
    """Where one until-decided arm stopped (run.json ``sequential_stops``)."""

    route: str
    variant: str
    num_speculative_tokens: int | None
    load: str
    temperature: float
    pairs_sent: int
    verdict: str  # faster | slower | undecided
    speedup: Interval | None


class BlockRepeat(TypedDict):
    """A route × level whose blocks sent a prompt twice (run.json ``block_repeats``)."""

    route: str
    load: str
    prompts: int


class PrefixCache(TypedDict):
    """What the run's --prefix-cache policy did (run.json / summary.json
    ``prefix_cache``)."""

    policy: str  # cold | warm | off
    repo: str | None  # the per-arm parity repository served, if one was made
    own_engine_models: dict[str, str]  # arm -> its own engine model
    enforced: NotRequired[bool]


class ExternalArm(TypedDict):
    """One OpenAI-compatible arm as run.json records it."""

    openai: str  # the server's base URL
    model: str
    baseline: str | None  # the arm it pairs with; None for a baseline arm
    metrics: str | None  # its Prometheus page, None = not scraped
    acceptance_counters: str | None  # the runtime whose counters were read
    acceptance_note: str | None


class External(TypedDict, total=False):
    """run.json / summary.json ``external`` (empty without external arms)."""

    arms: dict[str, ExternalArm]
    chat_routes: list[str]  # routes whose servers render their own chat template


class Environment(TypedDict):
    """The machine and library versions a run recorded."""

    machine: JSONObject  # hostname, platform, processor, cpu_count, memory_bytes
    versions: dict[str, str | None]  # trtspec, python, torch, …, tritonserver


class RunInfo(TypedDict, total=False):
    """``run.json``: what ran, written when the run starts and completed when
    it ends (a killed run leaves ``complete: false``). Older or hand-made
    files may lack any key, so readers use ``.get``."""

    run_id: str
    git_commit: str | None
    spec: JSONObject  # name, hash, path
    machine: JSONObject
    versions: dict[str, str | None]
    server: JSONObject  # endpoint, repo, isolate, footprint
    external: External
    prefix_cache: PrefixCache
    started: str
    finished: str
    complete: bool
    incomplete_reason: str | None
    settings: JSONObject  # the bench settings, routes and arms (decision: DecisionRules)
    fingerprint: JSONObject | None  # trtspec.fingerprint
    client: dict[str, float | None]  # the client's lag probe
    incidents: list[JSONObject]  # stub crashes and server restarts
    sequential_stops: list[SequentialStop]
    block_repeats: list[BlockRepeat]


def load_run_info(path: Path) -> RunInfo:
    """``run.json`` (``{}`` when there is none: a run re-renders from its
    rows alone); invalid JSON is an error naming the file and the fix."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise BenchError(
            f"{path}: not valid JSON ({exc.msg})",
            hint="delete it to render from requests.jsonl alone",
        ) from None
    return cast(RunInfo, data)


class Totals(TypedDict):
    requests: int
    errors: int
    error_rate: float | None
    incidents: int
    warmup_requests: int


class ClientCost(TypedDict):
    """The client's own cost and its lag probe, with warnings."""

    overhead_ms_p50: float | None
    overhead_ms_p95: float | None
    overhead_wall_ms_p95: float | None
    send_lag_ms_p95: float | None
    lag_ms_p50: float | None
    lag_ms_p95: float | None
    lag_ms_max: float | None
    warnings: list[str]
    overhead_share_p95: NotRequired[float | None]


class LevelThroughput(TypedDict):
    route: str
    concurrency: int
    temperature: float
    requests: int
    tokens_per_second: float | None


class Summary(TypedDict):
    """The whole ``summary.json`` document."""

    schema_version: int
    tool: str
    tool_version: str
    run_id: str | None
    git_commit: str | None
    spec: JSONObject | None
    machine: JSONObject | None
    versions: dict[str, str | None] | None
    server: JSONObject | None
    external: External
    prefix_cache: PrefixCache | None
    started: str | None
    finished: str | None
    complete: bool
    incomplete_reason: str | None
    settings: JSONObject
    totals: Totals
    client: ClientCost
    incidents: list[JSONObject]
    fingerprint: JSONObject | None
    cells: list[Cell]
    load_throughput: list[LevelThroughput]
    block_repeats: list[BlockRepeat]
    decisions: list[Decision]
    routing: RoutingDocument


def save_summary(run_dir: Path, summary: Summary) -> Path:
    """Write ``summary.json`` atomically (flushed before the rename)."""
    path = Path(run_dir) / SUMMARY_FILE
    fsutil.atomic_write_json(path, summary, fsync=True)
    return path


def load_summary(run_dir: Path) -> Summary:
    """The ``summary.json`` of a run folder; a missing folder or file, or one
    that is not a summary, is an error naming it and the fix."""
    path = Path(run_dir) / SUMMARY_FILE
    if not Path(run_dir).is_dir():
        raise BenchError(f"{run_dir}: not a folder", hint="pass run folders such as results/<run>/")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BenchError(
            f"{path}: not found", hint=f"render it with `trtspec report {run_dir}`"
        ) from None
    except (OSError, ValueError) as exc:
        raise BenchError(
            f"{path}: not readable JSON ({exc})",
            hint=f"re-render it with `trtspec report {run_dir}`",
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise BenchError(
            f"{path}: cells: missing", hint=f"re-render it with `trtspec report {run_dir}`"
        )
    return cast(Summary, data)
