"""The machine's refusals are expected errors (issue 10, D11): a read-only
folder, a full disk and a refused permission end in ``Error: <path>: …`` and
a ``Hint:``, exit 1, never "unexpected OSError … report it"; atomic writes
respect the umask; the bench recorder stops the run on a full disk and keeps
``requests.jsonl`` whole.

A full disk and a read-only file system are real where this process may mount
a tmpfs (root in a container): a 64 KiB tmpfs fills up, a ``ro`` one refuses
writes. Elsewhere the read-only case uses a folder without write permission
(EACCES) and the full disk is ``/dev/full``, whose writes the kernel fails
with ENOSPC."""

from __future__ import annotations

import contextlib
import errno
import getpass
import json
import os
import stat
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from trtspec import fsutil
from trtspec.bench.client import Arm, Job, Outcome
from trtspec.bench.recorder import Recorder
from trtspec.bench.records import RequestLog, read_requests
from trtspec.bench.runner import _write_failed
from trtspec.cli.main import cli
from trtspec.errors import os_error

FULL_HINT = (
    "free space on that disk (see `df -h {folder}`) or write somewhere else; files trtspec "
    "finished before are complete (each one is replaced atomically)"
)


@contextlib.contextmanager
def _tmpfs(where: Path, options: str) -> Iterator[bool]:
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        yield False
        return
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    try:
        yield done.returncode == 0
    finally:
        if done.returncode == 0:
            subprocess.run(["umount", str(where)], check=False)


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A folder nothing can be written into, and the errno a write gets there."""
    folder = tmp_path / "ro"
    with _tmpfs(folder, "ro,size=64k") as mounted:
        if mounted:
            yield folder, errno.EROFS
            return
        if os.geteuid() == 0:
            pytest.skip("root can write anywhere and may not mount a read-only tmpfs here")
        folder.chmod(0o555)
        try:
            yield folder, errno.EACCES
        finally:
            folder.chmod(0o755)


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path | None]:
    """A 64 KiB tmpfs (None where none can be mounted)."""
    with _tmpfs(tmp_path / "tiny", "size=64k") as mounted:
        yield tmp_path / "tiny" if mounted else None


def _expected(path: Path, code: int) -> str:
    folder = path.parent
    if code == errno.EROFS:
        return (
            f"Error: {path}: the file system is read-only\n"
            "Hint: write to a folder on a writable file system (pass another output "
            "folder)\n"
        )
    return (
        f"Error: {path}: permission denied\n"
        f"Hint: give user {getpass.getuser()} access to {folder} (see `ls -ld "
        f"{folder}`), or use another folder\n"
    )


# -- umask ---------------------------------------------------------------------


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o002, 0o077])
def test_atomic_writes_respect_the_umask(tmp_path: Path, mask: int) -> None:
    previous = os.umask(mask)
    try:
        assert fsutil.current_umask() == mask
        fsutil.atomic_write_text(tmp_path / "sub" / "f.txt", "x")
        staging = fsutil.make_staging_dir(".s.", tmp_path)
        log = RequestLog(tmp_path / "requests.jsonl")
        log.close()
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "sub" / "f.txt").stat().st_mode) == 0o666 & ~mask
    assert stat.S_IMODE((tmp_path / "sub").stat().st_mode) == 0o777 & ~mask
    assert stat.S_IMODE(staging.stat().st_mode) == 0o777 & ~mask
    assert stat.S_IMODE((tmp_path / "requests.jsonl").stat().st_mode) == 0o666 & ~mask


# -- read-only -----------------------------------------------------------------


def test_read_only_run_dir_is_an_expected_error(
    read_only_dir: tuple[Path, int], tiny_llama: Path
) -> None:
    folder, code = read_only_dir
    spec = folder.parent / "s.yaml"
    (folder.parent / "p.jsonl").write_text(json.dumps({"prompt": "Hi"}) + "\n")
    spec.write_text(
        "name: s\nbackend: reference\ntarget: {model: org/tiny, family: llama}\n"
        "variants:\n  - {name: ngram, mode: ngram, max_draft_len: 4}\n"
        "routes:\n  r: {prompts: p.jsonl, max_tokens: 8}\n"
    )
    run = folder / "run"
    res = CliRunner().invoke(
        cli,
        [
            "bench",
            str(spec),
            "--endpoint",
            "127.0.0.1:1",
            "--run-dir",
            str(run),
            "--tokenizer",
            str(tiny_llama),
        ],
    )
    assert res.exit_code == 1, res.output
    assert res.stdout == ""
    assert res.stderr == _expected(run, code)


def test_atomic_write_into_a_read_only_folder_names_the_file(
    read_only_dir: tuple[Path, int],
) -> None:
    folder, code = read_only_dir
    with pytest.raises(OSError) as err:
        fsutil.atomic_write_text(folder / "summary.json", "{}")
    assert (err.value.errno, err.value.filename) == (code, str(folder / "summary.json"))
    assert os.listdir(folder) == []


# -- full disk -----------------------------------------------------------------


def test_full_disk_atomic_write_fails_whole(tiny_disk: Path | None) -> None:
    if tiny_disk is None:
        pytest.skip("no tmpfs can be mounted here")
    target = tiny_disk / "summary.json"
    fsutil.atomic_write_text(target, "old")
    with pytest.raises(OSError) as err:
        fsutil.atomic_write_bytes(target, b"x" * 200_000)
    assert (err.value.errno, err.value.filename) == (errno.ENOSPC, str(target))
    assert target.read_text() == "old"  # the old file, not half of the new one
    assert sorted(os.listdir(tiny_disk)) == ["summary.json"]  # no temp file left
    error = os_error(err.value)
    assert error is not None
    assert (error.message, error.hint) == (
        f"{target}: no space left on the device",
        FULL_HINT.format(folder=tiny_disk),
    )


def _outcome(n: int) -> Outcome:
    job = Job(
        route="r",
        prompt_index=0,
        sample_index=n,
        item={"prompt": "p"},
        text_input="p",
        max_tokens=8,
        arm=Arm("baseline", "baseline"),
        temperature=0.0,
        top_p=1.0,
        top_k=0,
        seed=n,
        load="c=1",
        concurrency=1,
        request_rate=None,
        warmup=False,
        request_id=f"id{n}",
    )
    return Outcome(
        job, send_ns=1, end_ns=2_000_001, first_text_ns=1_000_001, text="x" * 3000, ids=[1, 2, 3]
    )


def test_recorder_stops_the_run_on_a_full_disk_and_keeps_whole_rows(
    tiny_disk: Path | None, tmp_path: Path
) -> None:
    path = tiny_disk / "requests.jsonl" if tiny_disk is not None else Path("/dev/full")
    log = RequestLog(path)
    stop = threading.Event()
    recorder = Recorder(log, "run", {"r": SimpleNamespace(checks=[])}, stop)  # type: ignore[dict-item]
    for n in range(40):  # ~7 KB a row: a 64 KiB disk fills after a few
        recorder.put(_outcome(n))
    recorder.close()
    log.close()
    assert stop.is_set()
    assert recorder.error is not None and recorder.error.errno == errno.ENOSPC
    assert recorder.error.filename == str(path)
    if tiny_disk is not None:
        rows = read_requests(path)  # every line whole: the failed one was cut back off
        assert 0 < log.count < 40 and len(rows) == log.count
        assert path.read_bytes().endswith(b"\n")
        assert [r["seq"] for r in rows] == list(range(1, log.count + 1))
    else:
        assert log.count == 0
    error = _write_failed(recorder.error, log.count, path)
    assert error.message == (
        f"{path}: no space left on the device; the run stopped, and the {log.count} requests "
        f"recorded before stay in {path}"
    )
    assert error.hint == FULL_HINT.format(folder=path.parent)


def test_cli_boundary_reports_os_errors_as_expected(tmp_path: Path, monkeypatch) -> None:
    # The spec loader reads; make the read fail the way a refused permission does.
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\n")

    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(spec))

    monkeypatch.setattr(Path, "read_text", refuse)
    res = CliRunner().invoke(cli, ["validate", str(spec)])
    assert res.exit_code == 1
    assert "unexpected" not in res.stderr
    assert res.stderr == _expected(spec, errno.EACCES)


def test_other_os_errors_stay_unexpected() -> None:
    assert os_error(OSError(errno.EBADF, "Bad file descriptor", "x")) is None
    assert os_error(FileNotFoundError(errno.ENOENT, "No such file", str(uuid.uuid4()))) is None


def test_a_reader_that_leaves_early_ends_the_command_quietly() -> None:
    """`trtspec build … --dry-run | head -1`: the pipe closes under the
    writer; the CLI stops with exit 1 and no `unexpected BrokenPipeError`."""
    import sys

    root = Path(__file__).resolve().parents[2]
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "trtspec.cli.main",
                "build",
                str(root / "build_specs" / "small-ngram.yaml"),
                "--dry-run",
            ],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 1
    assert proc.stderr == ""
