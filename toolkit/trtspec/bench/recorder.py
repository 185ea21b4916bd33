"""Outcomes to request rows (docs/design/decisions.md): one background thread
turns each finished request into a ``requests.jsonl`` row, quality checks
included, so the senders go straight back to sending."""

from __future__ import annotations

import queue
import threading

from trtspec.artifacts.bench_run import REQUEST_SCHEMA_VERSION, RequestRow
from trtspec.bench.client import Outcome
from trtspec.bench.quality import QualityRunner
from trtspec.bench.records import (
    ACCEPTANCE_NOT_REPORTED,
    RequestLog,
    ids_hash,
    text_hash,
)
from trtspec.bench.routes import RouteSet
from trtspec.catalogue import BASELINE


class Recorder:
    """Turns outcomes into rows on one background thread (quality checks
    included) so workers go straight back to sending."""

    def __init__(
        self,
        log: RequestLog,
        run_id: str,
        routes: dict[str, RouteSet],
        stop: threading.Event | None = None,
    ) -> None:
        self.log, self.run_id, self.routes = log, run_id, routes
        self.quality = QualityRunner()
        self._queue: queue.Queue[Outcome | None] = queue.Queue()
        self._seq = 0
        # A row that cannot be written (full disk) stops the run through `stop`
        # and is raised by close(); later outcomes are dropped, not half-written.
        self._stop = stop
        self.error: OSError | None = None
        self._thread = threading.Thread(target=self._loop, name="trtspec-recorder", daemon=True)
        self._thread.start()

    def put(self, outcome: Outcome) -> None:
        self._queue.put(outcome)

    def _loop(self) -> None:
        while True:
            out = self._queue.get()
            if out is None:
                return
            if out.error == "interrupted" or self.error is not None:
                continue  # cut short by Ctrl-C, or nowhere to write: not a result
            try:
                self.log.append(self.row(out, self._seq + 1))
            except OSError as exc:
                self.error = exc
                if self._stop is not None:
                    self._stop.set()
                continue
            self._seq += 1

    def close(self) -> None:
        """Record what is queued (``error`` then says whether a write failed)."""
        self._queue.put(None)
        self._thread.join()

    def row(self, out: Outcome, seq: int) -> RequestRow:
        job, f = out.job, out.final
        latency = (out.end_ns - out.send_ns) / 1e6 if out.end_ns else None
        ttft = (out.first_text_ns - out.send_ns) / 1e6 if out.first_text_ns else None
        n = f.get("completion_tokens")
        if n is None and not out.error:
            n = len(out.ids)
        tpot = (
            (latency - ttft) / (n - 1)
            if latency is not None and ttft is not None and n and n > 1
            else None
        )
        tps = n / (latency / 1e3) if n and latency else None
        route = self.routes[job.route]
        quality = (
            self.quality.run(route.checks, out.text, job.item, job.prompt_index)
            if not out.error and route.checks
            else {}
        )

        def ns_ms(v):
            return None if v is None else v / 1e6

        arm = job.arm
        pairs_with = arm.baseline if arm.openai else (None if arm.variant == BASELINE else BASELINE)
        # a served variant that leaves its draft/accepted counts out (the LLM-API
        # flow at versions whose llmapi model zeroes them): not available, never 0
        unreported = (
            arm.speculative and not arm.openai and not out.error and f.get("draft_tokens") is None
        )
        return {
            "schema_version": REQUEST_SCHEMA_VERSION,
            "run_id": self.run_id,
            "seq": seq,
            "warmup": job.warmup,
            "route": job.route,
            "prompt_index": job.prompt_index,
            "sample_index": job.sample_index,
            "variant": job.arm.variant,
            "model": job.arm.model,
            "mode": job.arm.mode,
            "speculative": job.arm.speculative,
            "draft_model": job.arm.draft_model,
            "num_speculative_tokens": job.arm.k,
            "temperature": job.temperature,
            "top_p": job.top_p,
            "top_k": job.top_k,
            "seed": job.seed,
            "max_tokens": job.max_tokens,
            "load": job.load,
            "concurrency": job.concurrency,
            "request_rate": job.request_rate,
            "request_id": job.request_id,
            "send_time_unix": out.send_time_unix,
            "prompt_tokens": f.get("prompt_tokens"),
            "completion_tokens": n,
            "ttft_ms": ttft,
            "latency_ms": latency,
            "tpot_ms": tpot,
            "tokens_per_second": tps,
            "accepted_tokens": f.get("accepted_tokens"),
            "draft_tokens": f.get("draft_tokens"),
            "rounds": f.get("rounds"),
            "server_ttft_ms": ns_ms(f.get("server_ttft_ns")),
            "prefix_reused_tokens": _reused(f.get("prefix_reused_tokens")),
            "server_total_ms": ns_ms(f.get("server_total_ns")),
            "served_variant": f.get("variant"),
            "fallback": f.get("fallback"),
            "error": out.error,
            "incident": out.incident,
            "text_hash": text_hash(out.text),
            # OpenAI streams carry text, not token ids
            "output_ids_hash": None if arm.openai else ids_hash(out.ids),
            # at T > 0 the first token is a draw from the target's distribution
            # for this prompt (bench/distribution.py compares the arms')
            "first_token": out.ids[0] if out.ids and not arm.openai else None,
            "output_text": out.text,
            "quality": quality,
            "client_overhead_ms": out.overhead_ns / 1e6,
            "client_overhead_wall_ms": out.overhead_wall_ns / 1e6,
            "send_lag_ms": None if out.send_lag_ns is None else out.send_lag_ns / 1e6,
            "responses": out.responses,
            "arm_kind": "openai" if arm.openai else "triton",
            "pairs_with": pairs_with,
            "acceptance_source": f.get(
                "acceptance_source",
                "response" if arm.speculative and not arm.openai and not unreported else None,
            ),
            "acceptance_note": f.get(
                "acceptance_note", ACCEPTANCE_NOT_REPORTED if unreported else None
            ),
            "accepted_per_position": f.get("accepted_per_position"),
            "drafted_per_position": f.get("drafted_per_position"),
            "finish_reason": f.get("finish_reason"),
        }


def _reused(value: int | None) -> int | None:
    # the orchestrator sends -1 when its engine reports no perf metrics
    return None if value is None or value < 0 else int(value)
