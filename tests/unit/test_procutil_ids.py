"""``procutil.unique_id``: the ids the router gives requests without one and
the cancellation tokens a chain's head mints (no system call per id, as
unguessable as ``uuid4``)."""

from __future__ import annotations

import os
import subprocess
import sys

from trtspec.procutil import unique_id
from trtspec.runtime.cancel import Cancellation


def test_ids_are_distinct_hex_of_uuid4_length() -> None:
    ids = [unique_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    # what a cancellation token must be to travel (cancel._token_of)
    assert all(i.isalnum() for i in ids[:10])


def test_ids_share_nothing_a_guess_could_use() -> None:
    """Keyed hashes of a counter, not a prefix and a count: knowing one id
    (a cancellation token, say) tells nothing of the next."""
    ids = [unique_id() for _ in range(200)]
    assert len({i[:6] for i in ids}) > 190
    assert len({i[-6:] for i in ids}) > 190


def test_every_process_has_its_own_key_also_after_a_fork() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: ids of its own, then gone without cleanup
        os.write(write, " ".join(unique_id() for _ in range(3)).encode())
        os._exit(0)
    here = [unique_id() for _ in range(3)]  # same counter state as the child's
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 256).decode().split()
    os.close(read)
    code = "from trtspec.procutil import unique_id; print(unique_id(), unique_id(), unique_id())"
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert len(set(here + child + other)) == 9


def test_a_chain_head_mints_a_distinct_token_per_request() -> None:
    tokens = {Cancellation(None).token for _ in range(100)}
    assert len(tokens) == 100
