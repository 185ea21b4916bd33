"""Generates the reference pages under docs/reference/ from the code itself.

``docs/reference/spec.md`` is rendered from the pydantic schema of
``trtspec.spec.Spec`` (field paths, types, defaults, descriptions),
``docs/reference/cli.md`` from every command's ``--help``. Each page is
generated whole; a test regenerates both and fails when a page is stale, and
``python -m trtspec.docgen --write`` rewrites them in place.
"""

from __future__ import annotations

import argparse
import sys
import types
import typing
from enum import Enum
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (list, tuple, set):
        inner = ", ".join(_type_name(a) for a in args if a is not Ellipsis)
        return f"list[{inner}]"
    if origin is dict:
        return f"map[{_type_name(args[0])}, {_type_name(args[1])}]"
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return " | ".join(str(m.value) for m in annotation)
    return getattr(annotation, "__name__", str(annotation))


def _models_in(annotation: Any) -> list[type]:
    from pydantic import BaseModel

    found: list[type] = []
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    for arg in typing.get_args(annotation):
        found.extend(_models_in(arg))
    return found


def _default(field: Any) -> str:
    from pydantic_core import PydanticUndefined

    if field.is_required():
        return "required"
    if field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:
            return "(derived)"
        from pydantic import BaseModel

        return "(defaults)" if isinstance(value, BaseModel) else f"`{value!r}`"
    if field.default is PydanticUndefined:
        return ""
    value = field.default.value if isinstance(field.default, Enum) else field.default
    return f"`{value!r}`" if value is not None else "`null`"


def _walk(model: type, prefix: str, rows: list[tuple[str, str, str, str]], seen: set) -> None:
    for name, field in model.model_fields.items():  # type: ignore[attr-defined]
        key = field.alias or name
        path = f"{prefix}{key}"
        doc = (field.description or "").replace("\n", " ").replace("|", "\\|")
        rows.append((path, _type_name(field.annotation).replace("|", "\\|"), _default(field), doc))
        for sub in _models_in(field.annotation):
            if (sub, path) in seen:
                continue
            seen.add((sub, path))
            origin = typing.get_origin(field.annotation)
            is_list = origin in (list, tuple) or "list[" in _type_name(field.annotation)
            is_map = "map[" in _type_name(field.annotation)
            child = f"{path}[]." if is_list else f"{path}.<name>." if is_map else f"{path}."
            mode = getattr(sub.model_fields.get("mode"), "default", None)  # type: ignore[attr-defined]
            if mode is not None and is_list:
                mode_value = mode.value if isinstance(mode, Enum) else mode
                child = f"{path}[mode={mode_value}]."
            _walk(sub, child, rows, seen)


def spec_reference() -> str:
    from trtspec.spec import Spec

    rows: list[tuple[str, str, str, str]] = []
    _walk(Spec, "", rows, set())
    lines = [
        "# Build spec reference",
        "",
        "Generated from `trtspec.spec.Spec` by `python -m trtspec.docgen --write`;",
        "a test fails when this page is stale. Unknown keys are errors; relative",
        "paths resolve against the spec file's folder. How to write a spec:",
        "[the spec guide](../guide/spec-and-routes.md).",
        "",
        "| field | type | default | meaning |",
        "|---|---|---|---|",
    ]
    lines += [f"| `{p}` | {t} | {d} | {m} |" for p, t, d, m in rows]
    return "\n".join(lines) + "\n"


def _command_help(cli: Any, path: list[str], parent: Any = None) -> list[tuple[str, str]]:
    import click

    # Built like Click builds them at run time (root settings, children
    # inheriting from their parent), with a fixed width so the text does not
    # depend on the terminal that regenerates it.
    settings = {} if parent is not None else dict(cli.context_settings)
    settings.update(terminal_width=88, max_content_width=88)
    ctx = click.Context(
        cli, info_name=path[-1] if parent is not None else " ".join(path), parent=parent, **settings
    )
    out = [(" ".join(path), cli.get_help(ctx))]
    if isinstance(cli, click.Group):
        for name in sorted(cli.list_commands(ctx)):
            sub = cli.get_command(ctx, name)
            if sub is not None and not getattr(sub, "hidden", False):
                out.extend(_command_help(sub, [*path, name], ctx))
    return out


def cli_reference() -> str:
    from trtspec.cli.main import cli

    lines = [
        "# CLI reference",
        "",
        "Generated from each command's `--help` by `python -m trtspec.docgen --write`;",
        "a test fails when this page is stale. Exit codes: 0 success, 1 an expected",
        "error (`Error:`/`Hint:` on stderr), 2 a usage error, 3 a failed benchmark gate.",
        "Set `TRTSPEC_DEBUG=1` for tracebacks.",
    ]
    for name, text in _command_help(cli, ["trtspec"]):
        lines += ["", f"## `{name}`", "", "```", text.rstrip(), "```"]
    return "\n".join(lines) + "\n"


def pages() -> dict[str, str]:
    """Every generated page: file name under docs/reference/ -> its text."""
    return {"spec.md": spec_reference(), "cli.md": cli_reference()}


def stale_pages(folder: Path | None = None) -> list[Path]:
    """The generated pages in ``folder`` whose text differs from fresh output."""
    folder = folder or REFERENCE
    stale = []
    for name, text in pages().items():
        path = folder / name
        try:
            current = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            current = None
        if current != text:
            stale.append(path)
    return stale


def write_pages(folder: Path | None = None) -> None:
    """Rewrite the stale pages atomically (temp file + rename)."""
    folder = folder or REFERENCE
    fresh = pages()
    folder.mkdir(parents=True, exist_ok=True)
    for path in stale_pages(folder):
        tmp = path.with_suffix(".md.tmp")
        tmp.write_text(fresh[path.name], encoding="utf-8")
        tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trtspec.docgen")
    parser.add_argument("--write", action="store_true", help="rewrite the generated pages")
    args = parser.parse_args(argv)
    if args.write:
        write_pages()
        return 0
    stale = stale_pages()
    for path in stale:
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        print(f"stale: {shown} (run python -m trtspec.docgen --write)")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
