"""Triton Python-backend model serving a reference engine with the ``tensorrtllm`` contract.

Loaded by Triton as ``<engine>/1/model.py`` (which re-exports
``TritonPythonModel`` from here). It reads ``gpt_model_path`` and the optional
``lookahead_*``, ``medusa_choices``, ``eagle_choices``,
``exclude_input_in_output``, ``enable_kv_cache_reuse`` and ``gpt_model_type``
parameters (``V1`` serves one request at a time; the in-flight batching types,
the default, hand every request to one ``engine.batching.BatchScheduler``,
whose thread hands each answer to a ``Responder`` thread that sends it, as
TensorRT-LLM's backend sends from a response thread of its own), takes
the TensorRT-LLM backend's input tensors by name (both the ≥0.20 names ``seed``
/ ``min_tokens`` and the older ``random_seed`` / ``min_length``; every tensor
with a leading batch dim), and answers with its output tensors. In decoupled
mode a ``streaming`` request gets one response per decoding step carrying only
the new tokens, then the final flag; otherwise one response with everything.
A bad request gets an ``INVALID_ARG`` ``TritonError`` response worded like
TRT-LLM's (sampling values checked by ``trtspec.runtime.limits``), and the model keeps
serving. A cancelled request (its client's, or its BLS caller's through
``trtspec.runtime.cancel``) stops before the next decoding step, frees its KV cache
and ends with an empty final response in decoupled mode (on 2.51 an error
after streamed responses never reaches a BLS caller), else a ``CANCELLED``
error. ``draft_logits`` ([1, k, vocab], next to ``draft_input_ids``) switch the
verification to speculative sampling, and ``return_generation_logits`` adds
``generation_logits`` ([1, 1, n, vocab], float32: one row per returned token)
to the response, as the backend does for a draft engine built with
``--gather_generation_logits``. torch and transformers are imported in
``initialize`` only, so this module imports anywhere.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from trtspec.runtime.cancel import POLL_S, Cancellation
from trtspec.runtime.limits import CLIENT_ERROR, ParamError, check_sampling
from trtspec.runtime.threads import WORKAROUND, Responder

try:  # only importable inside Triton's Python backend stub
    import triton_python_backend_utils as pb_utils
except ImportError:  # pragma: no cover - static checks, docs
    pb_utils = None


class InputError(Exception):
    """A request whose tensors are missing or malformed."""


def _param(config: dict[str, Any], key: str) -> str | None:
    value = (config.get("parameters") or {}).get(key, {}).get("string_value")
    if value is None or value.strip() == "" or value.strip().startswith("${"):
        return None
    return value.strip()


def _flag(text: str | None, default: bool) -> bool:
    if text is None:
        return default
    return text.strip().lower() in ("1", "true", "yes", "on")


def _first(request: Any, names: tuple[str, ...], default: Any) -> Any:
    for name in names:
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        if tensor is not None:
            arr = tensor.as_numpy().reshape(-1)
            if arr.size == 0:
                return default
            if arr.size > 1:
                raise InputError(
                    f"input tensor '{name}' must hold one value per request "
                    f"(got shape {list(tensor.as_numpy().shape)})"
                )
            return arr[0].item()
    return default


def _required(request: Any, name: str) -> np.ndarray:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        raise InputError(f"input tensor '{name}' not found")
    return tensor.as_numpy()


def _perf_tensors(
    gen: Any, prompt_len: int, tokens_per_block: int, names: frozenset[str] | set[str]
) -> list[Any]:
    """The perf outputs among ``names``, only those: a ``pb_utils.Tensor``
    costs the stub ~15-30 us of CPU each on two cores, and a caller that asks
    for one of the ten (the orchestrator: ``kv_cache_reused_blocks``) asked
    for it in every streamed response."""
    total = prompt_len + len(gen.output_ids)
    total_blocks = math.ceil(total / tokens_per_block)
    reused = gen.reused_tokens // tokens_per_block
    values = {
        "kv_cache_alloc_new_blocks": (total_blocks - reused, np.int32),
        "kv_cache_reused_blocks": (reused, np.int32),
        "kv_cache_alloc_total_blocks": (total_blocks, np.int32),
        "arrival_time_ns": (gen.arrival_time_ns, np.int64),
        "first_scheduled_time_ns": (gen.first_scheduled_time_ns, np.int64),
        "first_token_time_ns": (gen.first_token_time_ns, np.int64),
        "last_token_time_ns": (gen.last_token_time_ns, np.int64),
        "acceptance_rate": (gen.acceptance_rate, np.float32),
        "total_accepted_draft_tokens": (gen.total_accepted_draft_tokens, np.int32),
        "total_draft_tokens": (gen.total_draft_tokens, np.int32),
    }
    return [
        pb_utils.Tensor(name, np.array([[v]], dtype=dt))
        for name, (v, dt) in values.items()
        if name in names
    ]


class TritonPythonModel:
    """The reference engine behind the ``tensorrtllm`` backend's tensors."""

    def initialize(self, args: dict[str, Any]) -> None:
        from trtspec.runtime.engine.config import parse_choices, read_engine_config
        from trtspec.runtime.engine.decode import ReferenceEngine, default_threads

        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.output_names = {o["name"] for o in config.get("output") or []}
        path = _param(config, "gpt_model_path")
        if path is None:
            raise pb_utils.TritonModelException(
                "parameter gpt_model_path is not set: it must name a reference engine folder"
            )
        la_keys = (
            "lookahead_window_size",
            "lookahead_ngram_size",
            "lookahead_verification_set_size",
        )
        la_values = [_param(config, k) for k in la_keys]
        lookahead = None
        if all(v is not None for v in la_values):
            lookahead = tuple(int(v) for v in la_values)  # type: ignore[arg-type]
        instances = sum(int(g.get("count", 1)) for g in config.get("instance_group") or [{}])
        reuse = _flag(_param(config, "enable_kv_cache_reuse"), True)
        self.exclude_default = _flag(_param(config, "exclude_input_in_output"), False)
        self.engine = ReferenceEngine.load(
            path,
            threads=default_threads(instances),
            lookahead=lookahead,  # type: ignore[arg-type]
            medusa_choices=parse_choices(_param(config, "medusa_choices")),
            eagle_choices=parse_choices(_param(config, "eagle_choices")),
            # every in-flight sequence of a draft loop comes back next round:
            # keep room for a full batch of them (TRT-LLM's reuse is bounded by
            # KV memory, not a count)
            kv_reuse=max(4, 2 * read_engine_config(path).max_batch_size) if reuse else 0,
        )
        shared = getattr(self.engine.model, "_trtspec_shared", None)
        if shared is not None and shared.file is not None:
            pb_utils.Logger.log_info(
                f"reference engine: {shared.shared_bytes / 2**20:.0f} MiB of packed weights "
                f"{'written to' if shared.wrote else 'shared with'} {shared.file}"
                + (
                    ""
                    if shared.locked
                    else " (not locked in memory: `ulimit -l` allows less; while the engine "
                    "idles the kernel may page them out, to be read back on its next request)"
                )
                + (f"; {shared.why_not}" if shared.why_not else "")
            )
        elif shared is not None and shared.why_not not in ("off", "no packed weights"):
            pb_utils.Logger.log_warn(
                f"reference engine: packed weights not shared ({shared.why_not}); "
                "this engine holds its own copy"
            )
        self.scheduler: Any = None
        # gpt_model_type as the tensorrtllm backend reads it: V1 = no in-flight batching
        if (_param(config, "gpt_model_type") or "inflight_fused_batching").lower() != "v1":
            from trtspec.runtime.engine.batching import BatchScheduler

            # the engine's max_batch_size / max_num_tokens bound a step, as in TRT-LLM
            self.scheduler = BatchScheduler(self.engine)
            self.responder = Responder(log=pb_utils.Logger.log_error)

    # ------------------------------------------------------------------ parse
    def _request(self, request: Any) -> tuple[Any, dict[str, Any]]:
        from trtspec.runtime.engine.decode import GenerationRequest
        from trtspec.runtime.engine.sampling import SamplingParams

        lengths = _required(request, "input_lengths").reshape(-1)
        output_len = _required(request, "request_output_len").reshape(-1)
        ids = _required(request, "input_ids")
        batch = ids.shape[0] if ids.ndim > 1 else 1
        if batch != 1:
            raise InputError(
                f"batch size {batch} in one request is not supported by the "
                "reference engine: send one request per sequence"
            )
        ids = ids.reshape(-1)
        n = int(lengths[0]) if lengths.size else ids.size
        if n > ids.size or n < 0:
            raise InputError(
                f"input_lengths ({n}) is larger than the number of input_ids ({ids.size})"
            )
        beam = int(_first(request, ("beam_width",), 1))
        if beam != 1:
            raise InputError(
                f"beam_width {beam} is not supported by the reference engine "
                "(speculative decoding needs beam width 1)"
            )
        draft = pb_utils.get_input_tensor_by_name(request, "draft_input_ids")
        draft_ids = [int(t) for t in draft.as_numpy().reshape(-1)] if draft is not None else []
        logits = pb_utils.get_input_tensor_by_name(request, "draft_logits")
        draft_logits = None
        if logits is not None:
            rows = logits.as_numpy()
            if rows.ndim == 3 and rows.shape[0] == 1:  # [batch 1, k, vocab]
                rows = rows[0]
            draft_logits = rows.astype(np.float32)
        la = [
            _first(request, (k,), None)
            for k in (
                "lookahead_window_size",
                "lookahead_ngram_size",
                "lookahead_verification_set_size",
            )
        ]
        lookahead = None
        if any(v is not None for v in la):
            if any(v is None for v in la):
                raise InputError(
                    "lookahead_window_size, lookahead_ngram_size and "
                    "lookahead_verification_set_size must be given together"
                )
            lookahead = tuple(int(v) for v in la)
        end_id = _first(request, ("end_id",), None)
        seed_name = "random_seed" if _first(request, ("seed",), None) is None else "seed"
        sampling = SamplingParams(
            temperature=float(_first(request, ("temperature",), 0.0)),
            top_k=int(_first(request, ("runtime_top_k",), 0)),
            top_p=float(_first(request, ("runtime_top_p",), 1.0)),
            seed=int(_first(request, ("seed", "random_seed"), 0)),
        )
        try:
            check_sampling(
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k,
                seed=sampling.seed,
                names={"top_p": "runtime_top_p", "top_k": "runtime_top_k", "seed": seed_name},
            )
        except ParamError as exc:
            raise InputError(str(exc)) from None
        req = GenerationRequest(
            input_ids=[int(t) for t in ids[:n]],
            max_new_tokens=int(output_len[0]),
            end_id=int(end_id) if end_id is not None and int(end_id) >= 0 else None,
            sampling=sampling,
            draft_ids=draft_ids or None,
            lookahead=lookahead,  # type: ignore[arg-type]
            min_tokens=int(_first(request, ("min_tokens", "min_length"), 0)),
            draft_logits=draft_logits,
            return_generation_logits=bool(_first(request, ("return_generation_logits",), False)),
        )
        options = {
            "streaming": bool(_first(request, ("streaming",), False)),
            "exclude": bool(_first(request, ("exclude_input_in_output",), self.exclude_default)),
            # return_kv_cache_reuse_stats: the same request before TRT-LLM 0.19
            "perf": bool(
                _first(request, ("return_perf_metrics", "return_kv_cache_reuse_stats"), False)
            ),
        }
        if options["streaming"] and not self.decoupled:
            raise InputError(
                "Streaming is only supported if model is deployed using decoupled mode."
            )
        return req, options

    def _response(
        self,
        tokens: list[int],
        gen: Any,
        options: dict[str, Any],
        logit_rows: list[Any] | None = None,
    ) -> Any:
        tensors = [
            pb_utils.Tensor("output_ids", np.array([[tokens]], dtype=np.int32).reshape(1, 1, -1)),
            pb_utils.Tensor("sequence_length", np.array([[len(tokens)]], dtype=np.int32)),
        ]
        if gen.request.return_generation_logits:
            vocab = self.engine.config.vocab_size
            rows = np.zeros((0, vocab), dtype=np.float32)
            if logit_rows:
                rows = np.stack([r.numpy() for r in logit_rows]).astype(np.float32)
            tensors.append(pb_utils.Tensor("generation_logits", rows.reshape(1, 1, -1, vocab)))
        # Only what the caller asked for: the 2.51 stub prunes the rest in
        # ResponseSender::Send with the GIL released, freeing their NumPy
        # arrays without it (heap corruption; see runtime/threads.BlsStreams).
        wanted = options.get("outputs")
        if options["perf"]:
            # only the perf outputs this version's config declares (0.17, 0.18:
            # KV reuse) and, where it named some, the caller asked for
            names = self.output_names & wanted if wanted and WORKAROUND else self.output_names
            prompt_len = len(gen.request.input_ids)
            tensors += _perf_tensors(gen, prompt_len, self.engine.config.tokens_per_block, names)
        if wanted and WORKAROUND:
            tensors = [t for t in tensors if t.name() in wanted]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    # ---------------------------------------------------------------- execute
    def _cancelled(self, gen: Any) -> Any:
        pb_utils.Logger.log_info(
            f"reference engine: request cancelled after {len(gen.output_ids)} of "
            f"{gen.request.max_new_tokens} tokens ({gen.steps} steps); KV cache freed"
        )
        return pb_utils.InferenceResponse(
            output_tensors=[],
            error=pb_utils.TritonError("request cancelled", pb_utils.TritonError.CANCELLED),
        )

    def _error(self, exc: BaseException) -> Any:
        from trtspec.errors import TrtspecError

        if isinstance(exc, (InputError, TrtspecError)):
            return pb_utils.InferenceResponse(
                output_tensors=[],
                error=pb_utils.TritonError(
                    f"{CLIENT_ERROR}: {exc}", pb_utils.TritonError.INVALID_ARG
                ),
            )
        import traceback

        # a bug must fail this request, not the model
        pb_utils.Logger.log_error("".join(traceback.format_exception(exc)))
        return pb_utils.InferenceResponse(
            output_tensors=[],
            error=pb_utils.TritonError(f"reference engine internal error: {exc!r}"),
        )

    def _listener(self, sender: Any, options: dict[str, Any], cancel: Any) -> Any:
        """The scheduler-thread callback answering one request through ``sender``
        (sent from ``self.responder``'s thread, in order):
        a streaming request gets each step's delta (final flag on the last), any
        other one response with everything when it ends; a cancelled one ends
        as ``_run`` ends it."""
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        state = {"sent_final": False, "done": 0}

        def listen(gen: Any, delta: list[int] | None, error: BaseException | None) -> None:
            if state["sent_final"]:
                return
            if delta is not None:
                if options["streaming"]:
                    flags = final if gen.finished else 0
                    done = state["done"]
                    rows = gen.generation_logits[done : done + len(delta)]
                    state["done"] = done + len(delta)
                    sender.send(self._response(delta, gen, options, rows), flags=flags)
                    state["sent_final"] = bool(flags)
                return
            try:
                if error is not None:
                    sender.send(self._error(error), flags=final)
                elif gen.cancelled and (options["streaming"] or self.decoupled):
                    self._cancelled(gen)
                    sender.send(flags=final)
                elif gen.cancelled:
                    sender.send(self._cancelled(gen), flags=final)
                elif options["streaming"]:
                    sender.send(self._response([], gen, options), flags=final)
                else:
                    tokens = list(gen.output_ids)
                    if not options["exclude"]:
                        tokens = list(gen.request.input_ids) + tokens
                    sender.send(
                        self._response(tokens, gen, options, gen.generation_logits), flags=final
                    )
            finally:
                state["sent_final"] = True
                cancel.close()

        return listen

    def _submit(self, request: Any) -> None:
        """Hand one request to the in-flight batcher; its responses follow from
        the scheduler thread through the request's response sender."""
        sender = request.get_response_sender()
        cancel = Cancellation.of(request, sender if self.decoupled else request)
        try:
            req, options = self._request(request)
            options["outputs"] = set(request.requested_output_names() or ())
            self.scheduler.submit(
                req,
                # answers leave from the responder's thread: a step never waits on a send
                listener=self._listener(self.responder.sender(sender), options, cancel),
                is_cancelled=cancel.is_cancelled,
            )
        except Exception as exc:
            cancel.close()
            sender.send(self._error(exc), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _run(self, request: Any) -> Any:
        """Serve one request in this thread (``gpt_model_type: V1``); returns the
        (single) response when not decoupled."""
        from trtspec.errors import TrtspecError

        sender = request.get_response_sender() if self.decoupled else None
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        cancel = Cancellation.of(request, sender if sender is not None else request, poll_s=POLL_S)
        try:
            req, options = self._request(request)
            options["outputs"] = set(request.requested_output_names() or ())
            gen = self.engine.stream(req, cancelled=cancel.is_cancelled)
            if options["streaming"]:
                assert sender is not None  # streaming is refused unless decoupled
                sent_final, done = False, 0
                for delta in gen:
                    flags = final if gen.finished else 0
                    rows = gen.generation_logits[done : done + len(delta)]
                    done += len(delta)
                    sender.send(self._response(delta, gen, options, rows), flags=flags)
                    sent_final = bool(flags)
                if gen.cancelled:
                    self._cancelled(gen)
                    sender.send(flags=final)
                elif not sent_final:
                    sender.send(self._response([], gen, options), flags=final)
                return None
            for _ in gen:
                pass
            tokens = list(gen.output_ids)
            if not options["exclude"]:
                tokens = list(req.input_ids) + tokens
            if gen.cancelled and sender is not None:
                self._cancelled(gen)
                sender.send(flags=final)
                return None
            response = (
                self._cancelled(gen)
                if gen.cancelled
                else self._response(tokens, gen, options, gen.generation_logits)
            )
        except (InputError, TrtspecError) as exc:
            response = pb_utils.InferenceResponse(
                output_tensors=[],
                error=pb_utils.TritonError(
                    f"{CLIENT_ERROR}: {exc}", pb_utils.TritonError.INVALID_ARG
                ),
            )
        except Exception as exc:  # a bug must fail this request, not the model
            import traceback

            pb_utils.Logger.log_error(traceback.format_exc())
            response = pb_utils.InferenceResponse(
                output_tensors=[],
                error=pb_utils.TritonError(f"reference engine internal error: {exc!r}"),
            )
        finally:
            cancel.close()
        if sender is not None:
            sender.send(response, flags=final)
            return None
        return response

    def execute(self, requests: list[Any]) -> list[Any] | None:
        if self.scheduler is not None:
            # execute returns at once; Triton can hand this instance the next
            # requests while these decode (python_backend lets a model answer
            # later, from another thread, through each request's response sender).
            for request in requests:
                self._submit(request)
            return None
        responses = [self._run(r) for r in requests]
        return None if self.decoupled else responses

    def finalize(self) -> None:
        from trtspec.procutil import skip_interpreter_teardown

        if self.scheduler is not None:
            self.scheduler.close()  # fails what is queued or in flight ...
            self.responder.close()  # ... and those answers go out before the stub ends
        del self.engine
        # the stub's exit is part of the server's stop time (issue 24: < 2 s)
        skip_interpreter_teardown()
