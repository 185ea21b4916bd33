"""``trtllm-serve`` per variant: the LLM-API flow served without Triton.

``TrtllmServeFleet`` starts one ``trtllm-serve`` per variant (argv from
``llmapi_config.serve_commands``: the variant's LLM-argument file, its own
port, loopback by default), each in its own process group with a
parent-death signal so a killed trtspec leaves no server behind, waits until
every one answers ``GET /health`` with 200 (failing with the log tail of one
that exits or stays unready past the deadline), and stops them with SIGTERM,
then SIGKILL after a grace period. ``external_arms()`` is what the bench's
``bench.external`` section needs to drive them over the OpenAI API, each
speculative variant paired with the ``baseline`` server.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from trtspec.catalogue import BASELINE
from trtspec.errors import ServerError
from trtspec.procutil import parent_death_hook

STOP_GRACE_S = 30.0
POLL_S = 0.5
LOG_TAIL_CHARS = 3000


@dataclass
class Member:
    variant: str
    argv: list[str]
    host: str
    port: int
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    _log_file: IO[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def tail(self) -> str:
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")[-LOG_TAIL_CHARS:]
        except OSError:
            return ""


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


class TrtllmServeFleet:
    """One ``trtllm-serve`` process per variant; use as a context manager."""

    def __init__(
        self, commands: dict[str, list[str]], log_dir: Path, *, binary: str | None = None
    ) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.members = [
            Member(
                variant=name,
                argv=[binary or argv[0], *argv[1:]],
                host=_option(argv, "--host"),
                port=int(_option(argv, "--port")),
                log=log_dir / f"trtllm-serve.{name}.log",
            )
            for name, argv in commands.items()
        ]

    def __enter__(self) -> TrtllmServeFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout_s: float = 1800.0) -> None:
        """Start every server, then wait until all are healthy."""
        try:
            for m in self.members:
                m._log_file = open(m.log, "wb")  # noqa: SIM115 - closed in stop()
                try:
                    m.proc = subprocess.Popen(
                        m.argv,
                        stdout=m._log_file,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                        preexec_fn=parent_death_hook(signal.SIGTERM),  # noqa: PLW1509 - no threads run in the child before exec
                    )
                except OSError as exc:
                    raise ServerError(
                        f"cannot start {m.argv[0]} for variant {m.variant}: {exc}",
                        hint="run inside the TensorRT-LLM container, or pass the "
                        "trtllm-serve binary",
                    ) from None
            self._wait_healthy(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        pending = list(self.members)
        while pending:
            for m in list(pending):
                assert m.proc is not None
                if m.proc.poll() is not None:
                    raise ServerError(
                        f"trtllm-serve for variant {m.variant} exited {m.proc.returncode} "
                        f"before it was ready; log {m.log}:\n{m.tail()}",
                        hint="fix what the log says (the variant's file is "
                        f"{_option(m.argv, '--extra_llm_api_options')})",
                    )
                if _healthy(m.url):
                    pending.remove(m)
            if pending and time.monotonic() > deadline:
                m = pending[0]
                raise ServerError(
                    f"trtllm-serve for variant {m.variant} not healthy at {m.url}/health "
                    f"after {timeout_s:.0f}s; log {m.log}:\n{m.tail()}",
                    hint="a large model loads for minutes: raise --timeout",
                )
            if pending:
                time.sleep(POLL_S)

    def stop(self) -> None:
        """SIGTERM every server's process group, SIGKILL what outlives the grace."""
        running = [m for m in self.members if m.proc is not None and m.proc.poll() is None]
        for m in running:
            assert m.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(m.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for m in running:
            assert m.proc is not None
            try:
                m.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(m.proc.pid, signal.SIGKILL)
                m.proc.wait()
        for m in self.members:
            if m._log_file is not None:
                m._log_file.close()
                m._log_file = None

    def external_arms(self, model: str) -> dict[str, dict[str, Any]]:
        """``bench.external`` entries for these servers (``model`` = the served name)."""
        return {
            m.variant: {
                "openai": m.url,
                "model": model,
                **({} if m.variant == BASELINE else {"baseline": BASELINE}),
                "metrics": f"{m.url}/prometheus/metrics",
            }
            for m in self.members
        }


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False
