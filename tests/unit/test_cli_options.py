"""A Click option that several commands take is declared once (``cli/_options``,
or the command module's own constant) and reused, drawn from the source with
``ast``; what stays declared twice means something different to each
command, and says what. And the shared ``--fail-on`` keeps each command's own
metric names."""

from __future__ import annotations

import ast
import collections
from pathlib import Path

from click.testing import CliRunner

from trtspec.cli.main import cli

CLI = Path(__file__).resolve().parents[2] / "toolkit" / "trtspec" / "cli"
#: flags declared more than once on purpose: a different option under one name
DIFFERENT = {
    "--force": "build: rebuild cached steps; deploy: replace the output folder; rollout "
    "advance: against the window; routes import: replace files in --out",
    "--timeout": "bench: per request; serve: server ready; serve-llmapi: every /health",
    "--out": "deploy k8s (default deploy/<spec>), deploy dynamo (required), routes (a folder)",
    "--output": "bench: the results root; repo: the repository root",
    "--repo": "bench: a repository to serve; deploy k8s: the built one to read",
    "--routing": "repo reads any path (refused when read); deploy's must be a file",
    "--only": "build: a variant; routes import: categories",
    "--image": "deploy k8s: the serving image; deploy dynamo: the runtime image",
    "--route": "deploy k8s --rate: one route; rollout status: repeatable filter",
    "--baseline-only": "deploy k8s: although the spec has variants; deploy dynamo: only "
    "with --spec and no --routing",
    "--why": "rollout advance (no default) and rollback (a default reason)",
}


def declarations() -> dict[str, list[str]]:
    """flag -> where a ``click.option`` call declares it (``module:line``)."""
    found: dict[str, list[str]] = collections.defaultdict(list)
    for path in sorted(CLI.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "click.option":
                flags = [
                    a.value
                    for a in node.args
                    if isinstance(a, ast.Constant) and str(a.value).startswith("--")
                ]
                if flags:
                    found[flags[0]].append(f"{path.name}:{node.lineno}")
    return found


def test_an_option_several_commands_take_is_declared_once() -> None:
    found = declarations()
    assert len(found) > 60  # the walk saw the commands' options
    twice = {flag: where for flag, where in found.items() if len(where) > 1}
    assert sorted(set(twice) - set(DIFFERENT)) == [], twice
    assert sorted(set(DIFFERENT) - set(twice)) == []  # an allowance no longer needed goes


def test_the_shared_options_reach_every_command_that_takes_them() -> None:
    def takes(flag: str) -> set[str]:
        out = set()

        def walk(cmd, path):  # type: ignore[no-untyped-def]
            if any(flag in p.opts for p in cmd.params):
                out.add(path)
            for name, sub in getattr(cmd, "commands", {}).items():
                walk(sub, f"{path} {name}".strip())

        walk(cli, "")
        return out

    assert takes("--host") == {"serve", "serve-llmapi"}
    assert takes("--examples-dir") == {"build", "doctor"}
    assert takes("--namespace") >= {"deploy k8s", "deploy dynamo", "rollout status"}
    assert takes("--fail-on") >= {"bench", "compare"}


def test_fail_on_keeps_each_commands_metrics(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(cli, ["compare", str(tmp_path), str(tmp_path), "--fail-on", "speedup<1"])
    assert res.exit_code == 2
    assert "unknown metric 'speedup'" in res.output and "speedup_drop" in res.output
    res = runner.invoke(cli, ["bench", "spec.yaml", "--fail-on", "speedup_drop>0.1"])
    assert res.exit_code == 2
    assert "unknown metric 'speedup_drop'" in res.output
