"""README's generated reference sections must match the code (schema, --help)."""

from __future__ import annotations

from trtspec import docgen


def test_readme_reference_sections_are_fresh() -> None:
    current = docgen.README.read_text()
    assert current == docgen.render_readme(current), (
        "README.md's spec or CLI reference is stale: run `python -m trtspec.docgen --write`"
    )


def test_spec_reference_covers_every_mode_and_section() -> None:
    text = docgen.spec_reference()
    for needle in (
        "variants[mode=draft_model]",
        "variants[mode=ngram]",
        "variants[mode=medusa]",
        "variants[mode=eagle]",
        "variants[mode=lookahead]",
        "`routes",
        "`bench",
        "`rollout",
        "`stack.trtllm_version`",
    ):
        assert needle in text, needle


def test_cli_reference_covers_every_command() -> None:
    text = docgen.cli_reference()
    for command in ("validate", "build", "inspect", "repo", "serve", "bench", "report"):
        assert f"#### `trtspec {command}`" in text, command


def test_check_mode_reports_a_stale_readme(tmp_path, monkeypatch, capsys) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(
        "intro\n<!-- spec-reference:start -->\nold\n<!-- spec-reference:end -->\n"
        "<!-- cli-reference:start -->\nold\n<!-- cli-reference:end -->\n"
    )
    monkeypatch.setattr(docgen, "README", readme)
    assert docgen.main([]) == 1
    assert "stale: README.md" in capsys.readouterr().out
    assert docgen.main(["--write"]) == 0
    assert docgen.main([]) == 0
    assert readme.read_text().startswith("intro\n")
