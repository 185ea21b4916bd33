"""The router running a variant's generation in its own process: one Triton
hop (and one Python stub's receive and send per streamed token) fewer.

With the router config parameter ``in_process_variants: true`` (what
``trtspec repo`` writes) the router does not call the chosen variant's
orchestrator model over BLS on the first try. It loads that orchestrator's
config (``<repository>/<variant>/config.pbtxt``) into an orchestrator
``TritonPythonModel`` of its own and runs the same ``_Generation`` (the same
engine calls, text handling, stats and final response, ``variant`` named,
``fallback: false``) with the router's response sender and cancellation.
What the router's BLS relay does for each response holds here too: the
request's one deadline bounds every engine call of the generation
(``_Generation.deadline``) and, once past, ends it with ``DeadlineExceeded``
in the variant's name (the router then raises the cancel flag and never
retries); every response is counted (``progress.sent``, which the fallback
rule reads) and the first one carrying tokens and the final one are handed
to the rollout (``progress.track``: the request log's TTFT, token counts and
variant, the metrics); a cancel is seen between steps. Its other errors come
out as the orchestrator model's would, so the router's fallback and
client-error rules see no difference. The LLM-API flow's per-variant model
(``llmapi_adapter.py``) runs here the same way: its ``_run`` with the
router's sender and deadline, calling the variant's ``llmapi`` model
directly (router → llmapi model instead of router → adapter → llmapi
model). The fallback retry still goes over BLS (the route's safety net
stays the fallback's own model), and so does a variant whose model is
neither (``accepts``: an echo model, say).
``benchmarks/ceiling.py`` measures what it saves (layers ``full`` and ``bls``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from trtspec.runtime.cancel import Cancelled
from trtspec.runtime.health import watch
from trtspec.runtime.limits import CLIENT_ERROR
from trtspec.runtime.text import LocalText
from trtspec.runtime.threads import DeadlineExceeded

# The orchestrator module imports triton_python_backend_utils: imported where
# used, so PARAMETER can be read outside a stub (trtspec.bench.instant).

PARAMETER = "in_process_variants"
# the modules whose models run here, as a variant's model.py imports them
ORCHESTRATOR = "trtspec.runtime.models.orchestrator"
ADAPTER = "trtspec.runtime.models.llmapi_adapter"


class _RelayingSender:
    """The router's sender as the BLS relay uses it: counts what went out
    (``progress.sent``) and hands the rollout (``progress.track``) the first
    response until one carried tokens, and the final one."""

    def __init__(self, sender: Any, progress: Any, final_flag: int) -> None:
        self._sender = sender
        self._progress = progress
        self._final_flag = final_flag
        # the router's pruning sender's (threads.PruningSender), if it prunes
        self.wanted: frozenset[str] = getattr(sender, "wanted", frozenset())
        self._exact = getattr(sender, "send_exact", sender.send)

    def send_exact(self, response: Any, flags: int = 0) -> None:
        """A streamed response of ``wanted``'s outputs alone
        (PruningSender.send_exact). The generation streams only when it has
        tokens, so the first such response is the first token, whether or not
        the client asked for the outputs that carry them."""
        if self._progress.first_ns is None:
            self._track(response, False)
            if self._progress.first_ns is None:  # the client asked for no output with tokens
                self._progress.first_ns = time.monotonic_ns()
        self._exact(response, flags=flags)
        self._progress.sent += 1

    def send(self, response: Any = None, flags: int = 0) -> None:
        if response is None:
            self._sender.send(flags=flags)
        else:
            final = bool(flags & self._final_flag)
            if final or self._progress.first_ns is None:
                self._track(response, final)
            self._sender.send(response, flags=flags)
        self._progress.sent += 1

    def _track(self, response: Any, final: bool) -> None:
        self._progress.track({t.name(): t.as_numpy() for t in response.output_tensors()}, final)


class InProcessVariants:
    """Orchestrator models loaded in the router's process, one per variant,
    when the router starts (``preload``), else on first use; one tokenizer
    per folder shared by all of them."""

    def __init__(self, repository: Path) -> None:
        self.repository = Path(repository)
        self._models: dict[str, Any] = {}
        self._texts: dict[str, LocalText | None] = {}
        self._kinds: dict[str, str | None] = {}  # variant -> ORCHESTRATOR, ADAPTER or None
        self._lock = threading.Lock()

    @staticmethod
    def enabled(params: dict[str, str]) -> bool:
        return (params.get(PARAMETER) or "").strip().lower() in ("1", "true", "yes")

    def kind(self, variant: str) -> str | None:
        """``ORCHESTRATOR`` or ``ADAPTER`` when ``variant``'s ``model.py``
        loads that trtspec module (what runs here), else None."""
        with self._lock:
            if variant not in self._kinds:
                source = self.repository / variant / "1" / "model.py"
                try:
                    text = source.read_text(encoding="utf-8")
                except OSError:
                    text = ""
                self._kinds[variant] = next(
                    (k for k in (ORCHESTRATOR, ADAPTER) if f"from {k} import" in text), None
                )
            return self._kinds[variant]

    def accepts(self, variant: str) -> bool:
        """Whether ``variant`` runs here; anything else (an echo model, say)
        is called over BLS."""
        return self.kind(variant) is not None

    def preload(self, variants: Iterable[str], warn: Callable[[str], None]) -> list[str]:
        """Load every one of ``variants`` that runs here now (the router's
        ``initialize``), so that no request pays for it: a variant's first
        request used to import the config reader (protobuf and tritonclient's
        gRPC package, ~0.2 s) and load the orchestrator and its tokenizer,
        ~165 ms more time to first token on the demo repository. A variant
        that fails to load is left for its first request (which fails over to
        the fallback as before) and reported through ``warn``. Returns the
        variants loaded."""
        loaded = []
        for variant in sorted(variants):
            if not self.accepts(variant):
                continue
            try:
                self.model(variant)
            except Exception as exc:  # its first request meets the error, as before
                warn(f"router: variant {variant!r} not loaded in process at start: {exc}")
                continue
            loaded.append(variant)
        return loaded

    def model(self, variant: str) -> Any:
        kind = self.kind(variant)
        with self._lock:
            if variant not in self._models:
                self._models[variant] = self._load(variant, kind)
            return self._models[variant]

    def _load(self, variant: str, kind: str | None) -> Any:
        from google.protobuf import json_format

        from trtspec.runtime.model_config import read_config

        config = read_config(self.repository / variant / "config.pbtxt")
        as_dict = json_format.MessageToDict(config, preserving_proto_field_name=True)
        if kind == ADAPTER:
            from trtspec.runtime.models import llmapi_adapter

            adapter = llmapi_adapter.TritonPythonModel()
            adapter.initialize({"model_config": json.dumps(as_dict), "model_name": variant})
            return adapter
        from trtspec.runtime.models import orchestrator

        params = {
            k: v.get("string_value", "") for k, v in (as_dict.get("parameters") or {}).items()
        }
        folder = params.pop("tokenizer_dir", "")
        as_dict["parameters"] = {k: {"string_value": v} for k, v in params.items()}
        model = orchestrator.TritonPythonModel()
        model.initialize({"model_config": json.dumps(as_dict)})
        if folder not in self._texts:
            self._texts[folder] = LocalText.of_params({"tokenizer_dir": folder})
        model.text = self._texts[folder]
        return model

    def run(
        self,
        variant: str,
        inputs: dict[str, Any],
        sender: Any,
        progress: Any,
        cancel: Any,
    ) -> None:
        """Generate ``variant``'s answer to the request whose input tensors are
        ``inputs`` (name → array) through the router's ``sender`` by
        ``progress.deadline``; raises as the router's BLS call and relay would."""
        from trtspec.runtime.models import orchestrator, protocol

        start_ns = time.monotonic_ns()
        budget_s = max(0.0, progress.deadline - time.monotonic())
        gen = None
        try:
            model = self.model(variant)
            params = protocol.RequestParams.from_inputs(inputs)
            relay = _RelayingSender(
                sender, progress, orchestrator.pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            )
            if self.kind(variant) == ADAPTER:
                model._run(params, relay, cancel, deadline=progress.deadline)
                return
            gen = orchestrator._Generation(model, params, relay, start_ns, cancel)
            gen.deadline = progress.deadline
            gen.down = watch(variant)  # an engine's stub died: ends now, not at the deadline
            gen.wants_text = progress.wants_text
            gen.run()
        except Cancelled:
            if gen is not None:  # the line the orchestrator model logs (§5)
                orchestrator.pb_utils.Logger.log_info(
                    f"{variant}: request cancelled after {gen.completion} of "
                    f"{gen.params.max_tokens} tokens ({gen.stats.rounds} rounds)"
                )
            raise
        except DeadlineExceeded as exc:
            # in the words of the router's relay, which names the variant
            raise DeadlineExceeded(
                f"{variant}: no answer within its deadline of {budget_s:g} s; "
                "the request was stopped"
            ) from exc
        except Exception as exc:
            message = protocol.error_reply(variant, exc).message()
            marked = message.startswith(f"{variant}: {CLIENT_ERROR}: ")
            raise protocol.CalleeError(
                message, client=protocol.is_client_error(exc), marked=marked
            ) from exc

    def close(self) -> None:
        for model in self._models.values():
            streams = getattr(model, "streams", None) or getattr(model, "_streams", None)
            if streams is not None:
                streams.close()
