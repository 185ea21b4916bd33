# ruff: noqa: E501  (spec lines with exact columns read best on one line)
"""Model and checkpoint references must point at something a build can read
(issue 10, D12): ``target.model: /etc`` is rejected with file:line, field and
fix; so are a stray file, a folder without config.json as a draft model and
as a Medusa/EAGLE checkpoint. Hub ids (org/name) stay valid."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtspec.errors import SpecError
from trtspec.spec import load_spec

MODEL_FIX = (
    "point to a Hugging Face model folder (with config.json and the weights), a .gguf file, "
    "or use a hub id like org/name"
)


def _issues(path: Path) -> list[str]:
    with pytest.raises(SpecError) as err:
        load_spec(path)
    return err.value.issues


def _spec(tmp_path: Path, target: str, variants: str = "") -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: t\n"
        f"target: {{model: {target}, family: llama}}\n"
        "variants:\n"
        "  - {name: ngram, mode: ngram, max_draft_len: 4}\n" + variants
    )
    return path


def test_target_model_etc_is_not_a_model(tmp_path: Path) -> None:
    path = _spec(tmp_path, "/etc")
    assert _issues(path) == [
        f"{path}:2:17: target.model: /etc is a folder without config.json, not a model; {MODEL_FIX}"
    ]


def test_a_file_that_is_not_gguf_is_not_a_model(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"\0" * 8)
    path = _spec(tmp_path, "./weights.bin")
    assert _issues(path) == [
        f"{path}:2:17: target.model: {tmp_path / 'weights.bin'} is a file without config.json, "
        f"not a model; {MODEL_FIX}"
    ]


def test_draft_model_and_checkpoints_need_config_json(tmp_path: Path) -> None:
    for name in ("draft", "medusa", "eagle"):
        (tmp_path / name).mkdir()
    path = _spec(
        tmp_path,
        "org/target",
        "  - {name: d, mode: draft_model, max_draft_len: 4, draft: {model: ./draft, family: llama}}\n"
        "  - {name: m, mode: medusa, checkpoint: ./medusa, num_medusa_heads: 2,\n"
        "     medusa_choices: [[0], [1]]}\n"
        "  - {name: e, mode: eagle, checkpoint: ./eagle, num_eagle_layers: 1,\n"
        "     eagle_choices: [[0], [1]]}\n",
    )
    assert _issues(path) == [
        f"{path}:5:67: variants[1].draft.model: {tmp_path / 'draft'} is a folder without "
        f"config.json, not a model; {MODEL_FIX}",
        f"{path}:6:41: variants[2].checkpoint: {tmp_path / 'medusa'} is a folder without "
        "config.json, not a Medusa checkpoint; point to the Medusa checkpoint folder (with "
        "config.json and the weights)",
        f"{path}:8:40: variants[3].checkpoint: {tmp_path / 'eagle'} is a folder without "
        "config.json, not an EAGLE checkpoint; point to the EAGLE checkpoint folder (with "
        "config.json and the weights)",
    ]


def test_hub_ids_and_model_folders_stay_valid(tmp_path: Path) -> None:
    assert load_spec(_spec(tmp_path, "org/name")).target.model == "org/name"
    folder = tmp_path / "local"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert load_spec(_spec(tmp_path, "./local")).model_location("./local").kind == "local"
