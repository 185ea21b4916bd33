"""``make test``'s processes get the files of one ``Shared`` resource
together (tests/fixtures/shared.GROUPS): checked against what the collected
tests use, so a new user of a shared server cannot be left out (it would
start its own copy in another process)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tests.fixtures.shared import GROUPS, work_unit

TESTS = Path(__file__).resolve().parents[1]


def test_every_shared_resource_has_a_group() -> None:
    names = set()
    for source in TESTS.rglob("*.py"):
        names.update(re.findall(r'\bshared\(\s*"(\w+)"', source.read_text(encoding="utf-8")))
    assert names == set(GROUPS)


def test_every_file_that_uses_a_shared_resource_is_in_its_group(
    request: pytest.FixtureRequest,
) -> None:
    # judged on what this run collected (``make test``: everything; a
    # narrower run checks the files it has)
    root = Path(str(request.config.rootpath))
    files: dict[str, set[str]] = {}  # collected file -> the fixtures its tests use
    for item in request.session.items:
        rel = str(Path(str(item.path)).relative_to(root))
        files.setdefault(rel, set()).update(getattr(item, "fixturenames", ()))
    for name, paths in GROUPS.items():
        users = {rel for rel, used in files.items() if name in used}
        assert users <= set(paths), (name, sorted(users - set(paths)))
        # a listed file that ran here and no longer uses it
        idle = {rel for rel in paths if rel in files and name not in files[rel]}
        assert not idle, (name, sorted(idle))


def test_a_groups_files_are_one_unit_and_others_their_own() -> None:
    assert work_unit("tests/integration/test_repo_served.py::test_x[a]") == "every_mode_served"
    assert work_unit("tests/integration/test_requests_served.py::t") == "every_mode_served"
    assert work_unit("tests/e2e/test_external_arms.py::t") == "openai_pair"
    assert work_unit("tests/unit/test_spec.py::T::t") == "tests/unit/test_spec.py"
