"""The generated reference pages (docs/reference/) must match the code (schema, --help)."""

from __future__ import annotations

from trtspec import docgen


def test_reference_pages_are_fresh() -> None:
    stale = docgen.stale_pages()
    assert not stale, (
        f"stale reference pages {[str(p) for p in stale]}: run `python -m trtspec.docgen --write`"
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
        assert f"## `trtspec {command}`" in text, command


def test_check_mode_reports_a_stale_page(tmp_path, monkeypatch, capsys) -> None:
    (tmp_path / "spec.md").write_text("old\n")
    monkeypatch.setattr(docgen, "REFERENCE", tmp_path)
    assert docgen.main([]) == 1
    out = capsys.readouterr().out
    assert "stale: " in out and "spec.md" in out and "cli.md" in out
    assert docgen.main(["--write"]) == 0
    assert docgen.main([]) == 0
    assert (tmp_path / "spec.md").read_text() == docgen.spec_reference()
    assert not list(tmp_path.glob("*.tmp"))
