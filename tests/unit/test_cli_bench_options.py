"""``trtspec bench``'s flags reach the runner under one name: each option
other than the few the command itself handles is a ``BenchOptions`` field
of the same name, so a flag is declared once as an option and once as a
field (the command passes them through as keyword arguments)."""

from __future__ import annotations

import dataclasses

from trtspec.bench.runner import BenchOptions
from trtspec.cli.bench import CLI_ONLY, bench_command


def test_every_bench_flag_is_a_bench_options_field() -> None:
    names = {p.name for p in bench_command.params}
    fields = {f.name for f in dataclasses.fields(BenchOptions)}
    assert set(CLI_ONLY) <= names  # the exceptions are real options
    passed = names - set(CLI_ONLY)
    assert len(passed) > 15
    assert passed <= fields, sorted(passed - fields)
    # what the command fills in itself, from its own options
    assert fields - passed == {"output_dir", "plots"}
