# ruff: noqa: E501  (exact user-facing messages and argv lists read best on one line)
"""Spec loading and validation: every rule has an exact-message test."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest
from tests.fixtures.specs import DEMO_MODEL_SPECS, copy_example

from trtspec.catalogue import lookahead_max_draft_len
from trtspec.errors import SpecError
from trtspec.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(
    p.name for p in (ROOT / "build_specs").glob("*.yaml") if p.name not in DEMO_MODEL_SPECS
)

BASE = """\
name: t
target:
  model: org/target
  family: llama
variants:
  - name: ngram
    mode: ngram
    max_draft_len: 4
"""


def write(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def issues(path: Path) -> list[str]:
    with pytest.raises(SpecError) as err:
        load_spec(path)
    return err.value.issues


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_specs_are_valid(tmp_path: Path, name: str) -> None:
    spec = load_spec(copy_example(tmp_path, name))
    assert spec.warnings == []
    assert len(spec.spec_hash) == 64
    assert spec.source_path == (tmp_path / "build_specs" / name).resolve()


def test_vicuna_has_every_mode_and_derived_lengths(tmp_path: Path) -> None:
    spec = load_spec(copy_example(tmp_path, "vicuna-7b.yaml"))
    modes = {v.mode: v for v in spec.variants}
    assert set(modes) == {"draft_model", "ngram", "medusa", "eagle", "lookahead"}
    assert modes["lookahead"].max_draft_len == 15  # (4, 3, 4)
    assert modes["medusa"].max_draft_len == 10 == len(modes["medusa"].medusa_choices)
    assert modes["eagle"].max_draft_len == 10
    assert spec.stack.trtllm_version == "1.1.0"
    assert spec.stack.triton_image == "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3"


def test_defaults_and_hash_stability(tmp_path: Path) -> None:
    a = load_spec(write(tmp_path, BASE))
    b = load_spec(write(tmp_path, BASE.replace("name: t", "name: t  # comment"), "b.yaml"))
    assert a.spec_hash == b.spec_hash
    assert a.variants[0].num_draft_tokens == [4]
    assert a.dtype == "float16"
    assert a.target.kv_cache.tokens_per_block == 32
    assert a.rollout.fallback_variant == "baseline"
    c = load_spec(write(tmp_path, BASE.replace("max_draft_len: 4", "max_draft_len: 5"), "c.yaml"))
    assert c.spec_hash != a.spec_hash
    assert json.loads(json.dumps(a.canonical()))["target"]["model"] == "org/target"


@pytest.mark.parametrize(
    ("w", "n", "g", "d"), [(4, 3, 4, 15), (7, 7, 7, 83), (1, 1, 0, 0), (5, 2, 0, 4)]
)
def test_lookahead_formula(w: int, n: int, g: int, d: int) -> None:
    assert lookahead_max_draft_len(w, n, g) == d


def test_unknown_key_did_you_mean(tmp_path: Path) -> None:
    p = write(tmp_path, BASE.replace("  family: llama", "  family: llama\n  max_batch_sise: 4"))
    assert issues(p) == [
        f"{p}:5:3: target.max_batch_sise: unknown key 'max_batch_sise'; did you mean 'max_batch_size'?"
    ]


def test_unknown_key_in_variant_and_no_suggestion(tmp_path: Path) -> None:
    p = write(tmp_path, BASE + "    zzz: 1\n")
    assert issues(p) == [
        f"{p}:9:5: variants[0].zzz: unknown key 'zzz'; remove it; allowed keys: name, mode, "
        "max_draft_len, max_matching_ngram_size, num_draft_tokens, draft_schedule"
    ]


def test_flow_stream_interval_is_the_engine_flows_and_named_where_it_lives(
    tmp_path: Path,
) -> None:
    """The engine flow takes ``flow.stream_interval`` (>= 1); the LLM-API flow
    is told it is an LLM argument there; a flow's unknown key is placed at
    ``flow.<key>`` (not the union's ``flow.llmapi.<key>``) with its fix."""
    ok = load_spec(write(tmp_path, BASE + "flow: {kind: engine, stream_interval: 8}\n"))
    assert ok.flow.stream_interval == 8
    assert load_spec(write(tmp_path, BASE, "d.yaml")).flow.stream_interval == 1
    p = write(tmp_path, BASE + "flow:\n  kind: engine\n  stream_interval: 0\n", "a.yaml")
    assert issues(p) == [
        f"{p}:11:20: flow.stream_interval: input should be greater than or equal to 1 (got 0)"
    ]
    p = write(tmp_path, BASE + "flow:\n  kind: llmapi\n  stream_interval: 4\n", "b.yaml")
    assert issues(p) == [
        f"{p}:11:3: flow.stream_interval: unknown key 'stream_interval'; in the LLM-API flow "
        "it is an LLM argument: set flow.llm_args.stream_interval"
    ]
    p = write(tmp_path, BASE + "flow:\n  kind: llmapi\n  cuda_graph: true\n", "c.yaml")
    assert issues(p) == [
        f"{p}:11:3: flow.cuda_graph: unknown key 'cuda_graph'; did you mean 'cuda_graphs'?"
    ]


def test_duplicate_yaml_key(tmp_path: Path) -> None:
    p = write(tmp_path, BASE.replace("  family: llama", "  family: llama\n  family: qwen2"))
    assert issues(p) == [
        f"{p}:5:3: target.family: duplicate key 'family' (first at line 4); keep only one"
    ]


def test_yaml_syntax_error(tmp_path: Path) -> None:
    p = write(tmp_path, "name: [t\ntarget: {}\n")
    with pytest.raises(SpecError) as err:
        load_spec(p)
    assert err.value.issues[0].startswith(f"{p}:2:")
    assert "invalid YAML" in err.value.issues[0]


def test_missing_file_and_not_mapping(tmp_path: Path) -> None:
    assert issues(tmp_path / "nope.yaml") == [f"{tmp_path / 'nope.yaml'}: spec file not found"]
    p = write(tmp_path, "- a\n- b\n")
    assert issues(p) == [
        f"{p}:1:1: (top level): the spec must be a mapping with keys name, target, variants...; "
        "got ['a', 'b']"
    ]


def test_missing_key_wrong_type_and_enum(tmp_path: Path) -> None:
    p = write(
        tmp_path, BASE.replace("  family: llama\n", "  max_batch_size: lots\n  dtype: fp16\n")
    )
    assert issues(p) == [
        f"{p}:2:1: target: missing required key 'family'; add it",
        f"{p}:4:19: target.max_batch_size: expected an integer, got 'lots' (a string)",
        f"{p}:5:10: target.dtype: 'fp16' is not allowed; use one of 'float16', 'bfloat16' or 'float32'",
    ]


def test_range_violation(tmp_path: Path) -> None:
    p = write(tmp_path, BASE.replace("max_draft_len: 4", "max_draft_len: 0"))
    assert issues(p) == [
        f"{p}:8:20: variants[0].max_draft_len: input should be greater than or equal to 1 (got 0)"
    ]


def test_request_values_use_the_one_definition_of_their_limits(tmp_path: Path) -> None:
    """bench.seed, temperatures, top_p and top_k follow trtspec.runtime.limits (a seed
    past 2**64 used to validate and then crash a bench worker thread)."""
    p = write(
        tmp_path,
        BASE + "bench:\n  seed: 18446744073709551616\n"
        "  temperatures: [.nan, -1, .inf, 2.5]\n  top_p: .nan\n  top_k: -1\n",
    )
    assert issues(p) == [
        f"{p}:10:9: bench.seed: must be an unsigned 64-bit integer, in [0, 18446744073709551615] (got 18446744073709551616)",
        f"{p}:11:18: bench.temperatures[0]: must be a finite number >= 0 (0 = greedy) (got nan)",
        f"{p}:11:24: bench.temperatures[1]: must be a finite number >= 0 (0 = greedy) (got -1)",
        f"{p}:11:28: bench.temperatures[2]: must be a finite number >= 0 (0 = greedy) (got inf)",
        f"{p}:11:34: bench.temperatures[3]: must be at most 2.0 in a benchmark (got 2.5)",
        f"{p}:12:10: bench.top_p: must be in (0, 1] (1 = off) (got nan)",
        f"{p}:13:10: bench.top_k: must be an integer in [0, 2147483647] (0 = off) (got -1)",
    ]
    top = write(
        tmp_path, BASE + "bench: {seed: 18446744073709551615, temperatures: [0, 2]}\n", "top.yaml"
    )
    assert load_spec(top).bench.seed == 2**64 - 1


def test_unknown_mode(tmp_path: Path) -> None:
    p = write(tmp_path, BASE.replace("mode: ngram", "mode: ngrams"))
    assert issues(p) == [
        f"{p}:7:11: variants[0].mode: unknown mode 'ngrams'; did you mean 'ngram'?"
    ]


def test_draft_schedule_values(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, BASE, "ok.yaml"))
    assert spec.variants[0].draft_schedule == "constant"
    spec = load_spec(write(tmp_path, BASE + "    draft_schedule: adaptive\n", "ok2.yaml"))
    assert spec.variants[0].draft_schedule == "adaptive"
    p = write(tmp_path, BASE + "    draft_schedule: heuristic\n")
    assert issues(p) == [
        f"{p}:9:21: variants[0].draft_schedule: 'heuristic' is not allowed; use one of 'constant', 'adaptive' or 'confidence'"
    ]
    # The spec's names are the ones the orchestrator's DraftSchedule runs.
    from typing import get_args

    from trtspec.modes.base import DraftScheduleName
    from trtspec.runtime.speculate import DRAFT_SCHEDULES

    assert get_args(get_args(DraftScheduleName)[0]) == DRAFT_SCHEDULES


DRAFT_BASE = BASE.replace(
    "  - name: ngram\n    mode: ngram\n",
    "  - name: draft\n    mode: draft_model\n    draft: {model: org/draft, family: llama}\n",
)


def test_confidence_schedule_and_its_threshold(tmp_path: Path) -> None:
    from trtspec.modes.draft_model import needs_draft_logits, orchestrator_parameters

    spec = load_spec(write(tmp_path, DRAFT_BASE + "    draft_schedule: confidence\n", "ok.yaml"))
    v = spec.variants[0]
    assert (v.draft_schedule, v.draft_confidence_threshold) == ("confidence", None)
    # null = HF's default 0.4; the draft engine gathers logits for it
    assert orchestrator_parameters(v) == {
        "use_draft_logits": False,
        "draft_confidence_threshold": 0.4,
    }
    assert needs_draft_logits(v)
    text = DRAFT_BASE + "    draft_schedule: confidence\n    draft_confidence_threshold: 0.25\n"
    v = load_spec(write(tmp_path, text, "ok2.yaml")).variants[0]
    assert orchestrator_parameters(v)["draft_confidence_threshold"] == 0.25
    v = load_spec(write(tmp_path, DRAFT_BASE, "ok3.yaml")).variants[0]
    assert orchestrator_parameters(v) == {"use_draft_logits": False}
    assert not needs_draft_logits(v)

    p = write(tmp_path, DRAFT_BASE + "    draft_confidence_threshold: 0.3\n", "lone.yaml")
    assert issues(p) == [
        f"{p}:10:33: variants[0].draft_confidence_threshold: is read only by draft_schedule: "
        "confidence (this variant's is 'constant'); set draft_schedule: confidence or remove it"
    ]
    text = DRAFT_BASE + "    draft_schedule: confidence\n    draft_confidence_threshold: 1.5\n"
    p = write(tmp_path, text, "high.yaml")
    assert issues(p) == [
        f"{p}:11:33: variants[0].draft_confidence_threshold: input should be less than 1 (got 1.5)"
    ]
    p = write(tmp_path, BASE + "    draft_schedule: confidence\n", "ngram.yaml")
    assert issues(p) == [
        f"{p}:9:21: variants[0].draft_schedule: 'confidence' stops a draft by the draft "
        "model's own probability, and prompt lookup has none; use constant or adaptive "
        "(or mode: draft_model)"
    ]


def test_duplicate_variant_names(tmp_path: Path) -> None:
    p = write(tmp_path, BASE + "  - {name: ngram, mode: ngram, max_draft_len: 2}\n")
    assert issues(p) == [
        f"{p}:9:12: variants[1].name: duplicate variant name 'ngram' (also variants[0]); "
        "give each variant a unique name"
    ]


def test_variant_named_like_a_draft_engine(tmp_path: Path) -> None:
    spec = load_spec(
        write(
            tmp_path,
            BASE + "  - {name: draft_small, mode: draft_model, max_draft_len: 2,"
            " draft: {model: org/small, family: llama}}\n",
        )
    )
    from trtspec.plan import make_plan

    plan = make_plan(spec)
    engine = plan.variants["draft_small"].draft
    assert engine is not None and engine.startswith("draft_small_") and len(engine) == 18


def test_reserved_variant_name(tmp_path: Path) -> None:
    p = write(tmp_path, BASE.replace("name: ngram", "name: baseline"))
    assert issues(p) == [
        f"{p}:6:11: variants[0].name: 'baseline' is reserved for trtspec's own models; pick another name"
    ]


def test_beam_width_with_speculation(tmp_path: Path) -> None:
    p = write(tmp_path, BASE.replace("  family: llama", "  family: llama\n  max_beam_width: 4"))
    assert issues(p) == [
        f"{p}:5:19: target.max_beam_width: must be 1 with speculative variant 'ngram' (mode ngram); "
        "TensorRT-LLM speculative decoding has no beam search"
    ]


def test_draft_len_below_sweep(tmp_path: Path) -> None:
    p = write(tmp_path, BASE + "    num_draft_tokens: [2, 6, 8]\n")
    assert issues(p) == [
        f"{p}:8:20: variants[0].max_draft_len: 4 is smaller than num_draft_tokens [6, 8]; "
        "set max_draft_len to at least 8"
    ]


LOOKAHEAD = (
    BASE + "  - {name: la, mode: lookahead, window_size: 4, ngram_size: 3, verification_set_size: 4"
)


def test_lookahead_conflicting_draft_len(tmp_path: Path) -> None:
    p = write(tmp_path, LOOKAHEAD + ", max_draft_len: 16}\n")
    assert issues(p) == [
        f"{p}:9:105: variants[1].max_draft_len: 16 conflicts with (W=4, N=3, G=4), which needs "
        "exactly 15; remove max_draft_len or set it to 15"
    ]
    assert load_spec(write(tmp_path, LOOKAHEAD + ", max_draft_len: 15}\n", "ok.yaml"))


def test_lookahead_needs_trtllm_0_19(tmp_path: Path) -> None:
    # The tensorrtllm backend reads lookahead_window_size & co. from v0.19.0
    # (tests/data/tensorrtllm_parameters_0.17.txt has none of them).
    text = "stack: {trtllm_version: 0.18.2, triton_image: x:25.04-trtllm-python-py3}\n"
    p = write(tmp_path, text + LOOKAHEAD + "}\n")
    assert issues(p) == [
        f"{p}:10:22: variants[1].mode: lookahead needs TensorRT-LLM 0.19 or later (the Triton "
        "backend of 0.18.2 cannot configure it); raise stack.trtllm_version or drop the variant"
    ]


def test_lookahead_n1_rules(tmp_path: Path) -> None:
    text = (
        BASE
        + "  - {name: la, mode: lookahead, window_size: 2, ngram_size: 1, verification_set_size: 0}\n"
    )
    p = write(tmp_path, text)
    assert issues(p) == [
        f"{p}:9:61: variants[1].ngram_size: ngram_size 1 requires window_size 1 and "
        "verification_set_size 0; raise ngram_size or set W=1, G=0"
    ]
    p = write(tmp_path, text.replace("window_size: 2", "window_size: 1"), "b.yaml")
    assert issues(p) == [
        f"{p}:9:61: variants[1].ngram_size: (W=1, N=1, G=0) drafts nothing (max_draft_len 0); "
        "use ngram_size >= 2"
    ]


EAGLE = """\
name: t
target:
  model: org/target
  family: {family}
  pp: {pp}
  max_batch_size: {mbs}
variants:
  - name: eagle
    mode: eagle
    checkpoint: org/eagle
    eagle_choices: {choices}
    num_eagle_layers: {layers}
bench:
  temperatures: {temps}
"""


def eagle(
    tmp_path: Path,
    *,
    family: str = "llama",
    pp: int = 1,
    mbs: int = 8,
    choices: str = "[[0], [1], [0, 0]]",
    layers: int = 2,
    temps: str = "[0.0]",
) -> Path:
    return write(
        tmp_path,
        EAGLE.format(family=family, pp=pp, mbs=mbs, choices=choices, layers=layers, temps=temps),
    )


def test_eagle_rules(tmp_path: Path) -> None:
    assert load_spec(eagle(tmp_path)).variants[0].max_draft_len == 3
    p = eagle(tmp_path, family="qwen2", pp=2, mbs=1024, temps="[0.0, 0.7]")
    assert issues(p) == [
        f"{p}:5:7: target.pp: EAGLE variant 'eagle' needs pp: 1 (the EAGLE converter supports "
        "tensor parallelism only)",
        f"{p}:6:19: target.max_batch_size: 1024 exceeds EAGLE's limit of 512 (variant 'eagle'); "
        "set max_batch_size <= 512",
        f"{p}:9:11: variants[0].mode: EAGLE needs a Llama-family target (TensorRT-LLM's EAGLE "
        "converter reads Llama configs only), but target.family is 'qwen2'; drop the variant or "
        "use a Llama target",
        f"{p}:14:17: bench.temperatures: variant 'eagle' (eagle) decodes greedily only in "
        "TensorRT-LLM; use temperatures: [0.0] or drop the variant",
    ]


def test_a_route_at_its_own_temperature_is_checked_for_greedy_modes(tmp_path: Path) -> None:
    p = eagle(tmp_path)
    (tmp_path / "r.jsonl").write_text('{"prompt": "hi"}\n')
    p.write_text(
        p.read_text() + "routes:\n  chat:\n    prompts: r.jsonl\n    temperatures: [0.0, 0.7]\n"
    )
    assert issues(p) == [
        f"{p}:18:19: routes.chat.temperatures: variant 'eagle' (eagle) decodes greedily only in "
        "TensorRT-LLM; use temperatures: [0.0] or drop the variant",
    ]
    p.write_text(p.read_text().replace("[0.0, 0.7]", "[0.0, 2.5]"))
    assert issues(p)[0].startswith(f"{p}:18:25: routes.chat.temperatures[1]: ")


def test_eagle_draft_len_limit_and_tree(tmp_path: Path) -> None:
    big = "[" + ", ".join(f"[{i}]" for i in range(257)) + "]"
    p = eagle(tmp_path, choices=big, layers=1)
    assert issues(p) == [
        f"{p}:8:5: variants[0].max_draft_len: 257 exceeds EAGLE's limit of 256; use a smaller tree"
    ]
    p = eagle(tmp_path, choices="[[0], [1, 0], [0, 0, 0, 0, 0]]", layers=4)
    assert issues(p) == [
        f"{p}:11:20: variants[0].eagle_choices: path [1, 0] has no parent [1]; add the parent path",
        f"{p}:11:20: variants[0].eagle_choices: the tree is 5 deep but num_eagle_layers is 4; "
        "TensorRT-LLM needs the deepest path exactly num_eagle_layers long: set "
        "num_eagle_layers: 5 or shorten the deepest path",
    ]


def test_eagle_tree_must_be_exactly_num_eagle_layers_deep(tmp_path: Path) -> None:
    # examples/eagle/README.md: every tree exactly num_eagle_layers deep; the
    # example specs once shipped depth 3 with num_eagle_layers 4.
    p = eagle(tmp_path, choices="[[0], [0, 0], [1], [0, 0, 0]]", layers=4)
    assert issues(p) == [
        f"{p}:11:20: variants[0].eagle_choices: the tree is 3 deep but num_eagle_layers is 4; "
        "TensorRT-LLM needs the deepest path exactly num_eagle_layers long: set "
        "num_eagle_layers: 3 or add a path 4 deep"
    ]
    assert load_spec(eagle(tmp_path, choices="[[0], [0, 0], [1], [0, 0, 0]]", layers=3))


MEDUSA = (
    BASE
    + """\
  - name: medusa
    mode: medusa
    checkpoint: org/heads
    num_medusa_heads: 2
    medusa_choices: [[0], [0, 0], [0, 0, 0]]
    max_draft_len: 2
"""
)


def test_medusa_rules(tmp_path: Path) -> None:
    p = write(tmp_path, MEDUSA + "bench: {temperatures: [0.5]}\n")
    assert issues(p) == [
        f"{p}:13:21: variants[1].medusa_choices: a path is 3 deep but there are only 2 heads; "
        "shorten it or raise num_medusa_heads",
        f"{p}:14:20: variants[1].max_draft_len: 2 is smaller than the 3 medusa_choices nodes; "
        "remove it (derived = 3) or set it to at least 3",
        f"{p}:15:23: bench.temperatures: variant 'medusa' (medusa) decodes greedily only in "
        "TensorRT-LLM; use temperatures: [0.0] or drop the variant",
    ]


@pytest.mark.parametrize(
    ("version", "message"),
    [
        (
            "1.3.0",
            "TensorRT-LLM 1.3.0 is refused: the engine flow (convert_checkpoint.py + trtllm-build "
            "+ the tensorrtllm Triton backend) was removed upstream in 1.3; pin a version below "
            "1.3 (default 1.1.0)",
        ),
        (
            "0.16.0",
            "TensorRT-LLM 0.16.0 is refused: versions below 0.17 are not supported (different "
            "examples layout and speculative flags); use 0.17 or later",
        ),
        ("latest", "'latest' is not a version; write it like \"1.1.0\""),
    ],
)
def test_version_range(tmp_path: Path, version: str, message: str) -> None:
    p = write(tmp_path, BASE + f'stack: {{trtllm_version: "{version}", triton_image: x:y}}\n')
    assert issues(p) == [f"{p}:9:25: stack.trtllm_version: {message}"]


def test_image_version_mismatch_warns(tmp_path: Path) -> None:
    image = "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3"
    p = write(tmp_path, BASE + f'stack: {{trtllm_version: "0.17.0", triton_image: {image}}}\n')
    assert load_spec(p).warnings == [
        f"stack.triton_image {image} ships TensorRT-LLM 1.1.0, not 0.17.0"
    ]
    # 26.03 ships 1.2.0: the 1.2.1 pin is a different release.
    image = "nvcr.io/nvidia/tritonserver:26.03-trtllm-python-py3"
    p = write(tmp_path, BASE + f'stack: {{trtllm_version: "1.2.1", triton_image: {image}}}\n')
    assert load_spec(p).warnings == [
        f"stack.triton_image {image} ships TensorRT-LLM 1.2.0, not 1.2.1"
    ]


@pytest.mark.parametrize(
    ("version", "tag"),
    [
        ("1.1.0", "25.12"),
        ("1.2.1", "26.04"),
        ("1.2.0", "26.03"),
        ("1.2.2", "26.07"),
        ("1.0.3", "25.11"),
        ("0.19.0", "25.05"),
        ("0.18.2", "25.04"),
        ("0.17.0", "25.01"),
    ],
)
def test_image_defaults_from_the_version_table(tmp_path: Path, version: str, tag: str) -> None:
    # triton-inference-server/server docs/introduction/compatibility.md: 25.12-26.02
    # ship 1.1.0, 26.03 ships 1.2.0, 26.04-26.07 ship 1.2.1 (the first one is picked).
    spec = load_spec(write(tmp_path, BASE + f'stack: {{trtllm_version: "{version}"}}\n'))
    image = f"nvcr.io/nvidia/tritonserver:{tag}-trtllm-python-py3"
    assert spec.stack.triton_image == image
    # No container ships 1.2.2: the newest 1.2 one is picked, and the spec says so.
    assert spec.warnings == (
        [f"stack.triton_image {image} ships TensorRT-LLM 1.2.1, not 1.2.2"]
        if version == "1.2.2"
        else []
    )


def test_1_3_is_refused_with_its_reason_also_without_an_image(tmp_path: Path) -> None:
    p = write(tmp_path, BASE + 'stack: {trtllm_version: "1.3.0"}\n')
    assert issues(p) == [
        f"{p}:9:25: stack.trtllm_version: TensorRT-LLM 1.3.0 is refused: the engine flow "
        "(convert_checkpoint.py + trtllm-build + the tensorrtllm Triton backend) was removed "
        "upstream in 1.3; pin a version below 1.3 (default 1.1.0)"
    ]


def test_version_no_container_ships(tmp_path: Path) -> None:
    p = write(tmp_path, BASE + 'stack: {trtllm_version: "0.22.0"}\n')
    assert issues(p) == [
        f"{p}:9:25: stack.trtllm_version: no Triton container in trtspec's version table ships "
        "TensorRT-LLM 0.22.0; set stack.triton_image to the image you build in"
    ]
    spec = load_spec(
        write(
            tmp_path,
            BASE + 'stack: {trtllm_version: "0.22.0", triton_image: my/image:1}\n',
            "ok.yaml",
        )
    )
    assert spec.stack.triton_image == "my/image:1"


def test_missing_local_path_and_route_file(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        BASE.replace("org/target", "./models/nothere")
        + "routes:\n  chat: {prompts: routes/chat.jsonl}\n",
    )
    assert issues(p) == [
        f"{p}:3:10: target.model: local path not found: {tmp_path}/models/nothere; fix the path "
        f"(relative paths resolve against {tmp_path}) or use a hub id like org/name",
        f"{p}:10:19: routes.chat.prompts: file not found: {tmp_path}/routes/chat.jsonl; "
        "create it or fix the path",
    ]


def test_fallback_variant_must_exist(tmp_path: Path) -> None:
    p = write(tmp_path, BASE + "rollout: {fallback_variant: ngarm}\n")
    assert issues(p) == [
        f"{p}:9:29: rollout.fallback_variant: no variant named 'ngarm'; did you mean 'ngram'?"
    ]


def test_reference_backend_rules(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        BASE.replace("name: t", "name: t\nbackend: reference").replace(
            "  family: llama", "  family: llama\n  tp: 2\n  quantization: fp8"
        ),
    )
    assert issues(p) == [
        f"{p}:6:7: target.tp: the reference backend runs one process; set tp: 1 and pp: 1",
        f"{p}:7:17: target.quantization: 'fp8' needs the tensorrt_llm backend; the reference "
        "backend supports none or int8",
    ]


def test_draft_logits_run_on_the_reference_backend(tmp_path: Path) -> None:
    # The reference engine accepts by draft logits (speculative sampling) too.
    p = write(
        tmp_path,
        "name: t\nbackend: reference\ntarget: {model: org/t, family: llama}\nvariants:\n"
        "  - {name: d, mode: draft_model, max_draft_len: 2, use_draft_logits: true,\n"
        "     draft: {model: org/d, family: llama}}\n",
    )
    assert load_spec(p).variants[0].use_draft_logits is True


# ------------------------------------------------------------ draft vocabulary

DRAFT = """\
name: t
backend: reference
target: {{model: {target}, family: llama}}
variants:
  - name: d
    mode: draft_model
    draft: {{model: {draft}, family: llama}}
    max_draft_len: 4
"""


def _variant_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_draft_shares_vocabulary(tmp_path: Path, tiny_llama: Path, tiny_draft: Path) -> None:
    spec = load_spec(write(tmp_path, DRAFT.format(target=tiny_llama, draft=tiny_draft)))
    assert spec.warnings == []


def test_draft_vocabulary_mismatch(tmp_path: Path, tiny_llama: Path) -> None:
    other = _variant_copy(tiny_llama, tmp_path / "other")
    tok = json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = next(iter(vocab)), list(vocab)[-1]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other / "tokenizer.json").write_text(json.dumps(tok))
    p = write(tmp_path, DRAFT.format(target=tiny_llama, draft=other))
    assert issues(p) == [
        f"{p}:7:20: variants[0].draft.model: the draft's tokenizer (tokenizer.json) differs from the "
        "target's (tokenizer.json); draft and target must share a vocabulary: pick a draft from "
        "the target's model family"
    ]


def test_draft_vocab_size_mismatch_without_tokenizer(tmp_path: Path, tiny_llama: Path) -> None:
    target = _variant_copy(tiny_llama, tmp_path / "target")
    other = _variant_copy(tiny_llama, tmp_path / "other")
    for folder in (target, other):
        (folder / "tokenizer.json").unlink()
    cfg = json.loads((other / "config.json").read_text())
    cfg["vocab_size"] = 500
    (other / "config.json").write_text(json.dumps(cfg))
    p = write(tmp_path, DRAFT.format(target=target, draft=other))
    assert issues(p) == [
        f"{p}:7:20: variants[0].draft.model: the draft's vocab_size 500 differs from the target's "
        "384; draft and target must share a vocabulary"
    ]


def test_chat_template_mismatch_warns(tmp_path: Path, tiny_llama: Path) -> None:
    base = _variant_copy(tiny_llama, tmp_path / "base")
    cfg = json.loads((base / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (base / "tokenizer_config.json").write_text(json.dumps(cfg))
    for extra in ("chat_template.jinja", "chat_template.json"):
        (base / extra).unlink(missing_ok=True)
    spec = load_spec(write(tmp_path, DRAFT.format(target=tiny_llama, draft=base)))
    assert spec.warnings == [
        "variant 'd': the target has a chat template and the draft does not (base vs instruct "
        "mismatch?); acceptance rates may be low"
    ]
