"""``procutil.unique_id``: the ids the router gives requests without one and
the cancellation tokens a chain's head mints (no system call per id)."""

from __future__ import annotations

import os
import subprocess
import sys

from trtspec.cancel import Cancellation
from trtspec.procutil import unique_id


def test_ids_are_distinct_hex_of_uuid4_length() -> None:
    ids = [unique_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    # what a cancellation token must be to travel (cancel._token_of)
    assert all(i.isalnum() for i in ids[:10])


def test_each_process_has_its_own_prefix_also_after_a_fork() -> None:
    here = unique_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: an id of its own, then gone without cleanup
        os.write(write, unique_id().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    code = "from trtspec.procutil import unique_id; print(unique_id())"
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    prefixes = {here[:16], child[:16], other[:16]}
    assert len(prefixes) == 3


def test_a_chain_head_mints_a_distinct_token_per_request() -> None:
    tokens = {Cancellation(None).token for _ in range(100)}
    assert len(tokens) == 100
