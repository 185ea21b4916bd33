"""``trtspec routes import CORPUS``: a thin Click wrapper over
``trtspec.bench.corpus`` that turns Spec-Bench, MT-Bench, ShareGPT or
OpenAI-messages JSONL into one prompt set per category plus a ``routes.yaml``
block; the table (or ``--format json``) of written routes goes to stdout."""

from __future__ import annotations

from pathlib import Path

import click

from trtspec.cli._output import emit_json, emit_table, format_option, progress


@click.group("routes")
def routes_group() -> None:
    """Prompt sets for the benchmark's routes."""


@routes_group.command("import")
@click.argument("corpus", metavar="CORPUS", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for <route>.jsonl and routes.yaml.",
)
@click.option(
    "--from",
    "corpus_format",
    type=click.Choice(["auto", "spec_bench", "mt_bench", "sharegpt", "openai"]),
    default="auto",
    show_default=True,
    help="Corpus format (auto: from the first record's fields).",
)
@click.option(
    "--per-category",
    type=click.IntRange(min=1),
    help="Sample this many records per category (seeded; file order kept).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Sampling seed.")
@click.option(
    "--map",
    "mapping",
    multiple=True,
    metavar="CATEGORY=ROUTE",
    help="Put a category in a route of your naming (repeatable; several may share one).",
)
@click.option(
    "--only",
    metavar="CAT[,CAT…]",
    help="Import only these categories.",
)
@click.option(
    "--turns",
    type=click.Choice(["all", "first"]),
    default="all",
    show_default=True,
    help="all: keep multi-turn records whole where earlier answers exist (else cut to "
    "the first turn); first: always only the first user turn.",
)
@click.option(
    "--category",
    "default_category",
    default="imported",
    show_default=True,
    help="Category of records that carry none (ShareGPT and OpenAI exports).",
)
@click.option(
    "--spec-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder of the spec that will use the routes (prompt paths in routes.yaml are "
    "relative to it); default: the folder holding --out.",
)
@click.option("--force", is_flag=True, help="Replace existing files in --out.")
@format_option
def import_cmd(  # noqa: PLR0917 - one parameter per Click option
    corpus: Path,
    out_dir: Path,
    corpus_format: str,
    per_category: int | None,
    seed: int,
    mapping: tuple[str, ...],
    only: str | None,
    turns: str,
    default_category: str,
    spec_dir: Path | None,
    force: bool,
    fmt: str,
) -> None:
    """Import a corpus as one prompt set per category (route)."""
    from trtspec.bench.corpus import import_corpus, parse_mapping

    result = import_corpus(
        corpus,
        out_dir,
        fmt=corpus_format,
        turns=turns,
        mapping=parse_mapping(mapping),
        only=[c.strip() for c in only.split(",") if c.strip()] if only else None,
        per_category=per_category,
        seed=seed,
        default_category=default_category,
        overwrite=force,
        spec_dir=spec_dir,
    )
    rows = [
        {
            "route": r.name,
            "categories": r.categories,
            "prompts": len(r.items),
            "available": r.available,
            "cut_to_first_turn": r.cut,
            "max_tokens": r.max_tokens,
            "checks": r.checks,
            "file": str(r.path),
        }
        for r in result.routes
    ]
    if fmt == "json":
        emit_json({"format": result.format, "routes": rows, "routes_yaml": str(result.routes_yaml)})
    else:
        emit_table(
            ["route", "prompts", "of", "cut", "max_tokens", "checks", "file"],
            [
                [
                    r.name,
                    len(r.items),
                    r.available,
                    r.cut,
                    r.max_tokens,
                    ",".join(r.checks) or "-",
                    r.path,
                ]
                for r in result.routes
            ],
        )
    progress(
        f"read {result.source} as {result.format}; routes block for the spec: {result.routes_yaml}"
    )


COMMANDS: list[click.Command] = [routes_group]
