"""Triton Python model serving reference engines with the tensors of
TensorRT-LLM's ``llmapi`` model: the CPU stand-in for that model in the
LLM-API flow.

It reads the same ``<model>/1/model.yaml`` the upstream model reads
(``triton_config`` removed, the rest being LLM arguments): ``model`` (here a
reference engine folder that ``trtspec build`` made), ``tokenizer``
(default: the folder's ``tokenizer/``), ``max_batch_size`` and
``max_num_tokens`` (in-flight batching limits, capped by the engine's),
``kv_cache_config.enable_block_reuse`` and ``speculative_config``:

- none: target-only decoding;
- ``NGram``: prompt lookup over the request's own prompt and output
  (``max_matching_ngram_size``), ``max_draft_len`` tokens a round;
- ``Draft_Target`` (``DraftTarget`` in older versions): the
  ``speculative_model`` (``speculative_model_dir``) reference engine drafts
  ``max_draft_len`` tokens, the target verifies them in one step;
- both honour ``max_concurrency`` (no drafting while more requests are in
  flight; ``Drafter.should_use_spec_decode``) and ``draft_len_schedule``
  ({in-flight requests: draft length}) read as the pinned version's
  validators say (``trtspec.runtime.llm_args.rules``, the version from the
  ``trtspec_trtllm_version`` parameter that ``trtspec repo`` writes): at
  1.2.1 the largest key not above the load wins, at 1.3 the smallest key not
  below it, and none above the largest key (draft length 0); any other
  decoding type needs a GPU.

What it does not imitate (``trtspec validate`` says so for a reference
spec): CUDA graphs, tensor/pipeline parallelism, the KV-cache pool settings
beyond block reuse (``free_gpu_memory_fraction``, ``tokens_per_block``),
dtype, ``enable_iter_perf_stats`` and the rest of the LLM arguments, which
it reads past. Its acceptance outputs are what the pinned version's model
sends: zeros where it zeroes them (before upstream PR #17082; both pins,
``acceptance_outputs_zeroed`` in flows/data/triton_llmapi_model.json, which
``trtspec repo`` writes as the ``trtspec_acceptance_outputs`` parameter), the
round counts otherwise; the rounds it really ran are logged at the end of
each speculative request either way (``speculation: N draft, M accepted``).

The draft → verify loop is the orchestrator's (``trtspec.runtime.speculate``), run
in process against two ``engine.batching.BatchScheduler`` s, so concurrent
requests share each engine step. Inputs: ``text_input``, ``streaming``,
``sampling_param_{max_tokens,temperature,top_k,top_p,seed,
return_perf_metrics}``; outputs ``text_output`` and, with perf metrics, the
timing, KV and acceptance outputs. Streamed, every response's ``text_output``
is the whole text so far, as upstream's model sends ``CompletionOutput.text``
(``_create_response`` in triton_backend/all_models/llmapi/tensorrt_llm/1/model.py
at b35ac1b6, 1.2.0rc2, and 044a90d2; ``text`` is cumulative and ``text_diff``
the delta in tensorrt_llm/executor/result.py at 005bc848): one response per
answering iteration, its text changed or not, and the final response with
the whole answer again (upstream's last iteration is its final response; here
the final one follows it, with the same text). With ``return_finish_reason``
every response carries ``finish_reason``: "None" until the last, then "stop"
(the end id) or "length" (``str(output.finish_reason)`` in ``_create_response``).
``stream_interval`` (an LLM argument, default 1) is honoured as the PyTorch
executor does it (``PyExecutor._handle_responses``: a request answers at its
first decoding iteration, at every ``stream_interval``-th one and when it
finishes; read in a stored NVIDIA/TensorRT-LLM ``py_executor.py`` after
1.0, search-index file id 1891464528; an older one counted the executor's
global iteration instead): fewer, fuller responses per request, the first
token as soon as it exists. A round of speculation is one iteration.
torch and transformers load in ``initialize`` only.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trtspec.runtime.cancel import Cancellation, Cancelled
from trtspec.runtime.limits import ParamError, check_sampling
from trtspec.runtime.speculate import (
    RoundStats,
    accepted_count,
    draft_budget,
    propose_ngram,
    round_finished,
    round_seed,
)
from trtspec.runtime.threads import PruningSender, RequestThreads, Responder

try:  # only importable inside Triton's Python backend stub
    import triton_python_backend_utils as pb_utils
except ImportError:  # pragma: no cover - static checks, docs
    pb_utils = None

#: TensorRT-LLM's SamplingParams default when a request names no max_tokens.
DEFAULT_MAX_TOKENS = 32
DRAFT_TARGET_TYPES = ("Draft_Target", "DraftTarget")


class LlmApiConfigError(Exception):
    """A model.yaml the reference stand-in cannot serve."""


@dataclass
class Speculation:
    kind: str  # "ngram" | "draft"
    max_draft_len: int
    max_matching_ngram_size: int = 2
    max_concurrency: int | None = None
    draft_len_schedule: dict[int, int] | None = None
    schedule_keys: str = "lower_bound"  # llm_args.rules(version)["draft_len_schedule"]["keys"]

    def draft_len(self, in_flight: int) -> int:
        """The draft length at ``in_flight`` requests (TensorRT-LLM's load rules)."""
        from trtspec.runtime.llm_args import schedule_draft_len

        if self.max_concurrency is not None and in_flight > self.max_concurrency:
            return 0
        if self.draft_len_schedule:
            k = schedule_draft_len(self.draft_len_schedule, in_flight, self.schedule_keys)
            return self.max_draft_len if k is None else k
        return self.max_draft_len


def read_model_yaml(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(LLM arguments, triton_config) of a model.yaml."""
    import yaml

    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise LlmApiConfigError(f"{path}: unreadable model.yaml: {exc}") from None
    if not isinstance(doc, dict) or "model" not in doc:
        raise LlmApiConfigError(f"{path}: model.yaml must be a mapping with a 'model' key")
    triton = doc.pop("triton_config", None)
    if not isinstance(triton, dict) or not {"decoupled", "max_batch_size"} <= set(triton):
        raise LlmApiConfigError(
            f"{path}: triton_config with decoupled and max_batch_size is required "
            "(the llmapi model reads both)"
        )
    return doc, triton


def schedule_keys(version: str | None) -> str:
    """How ``draft_len_schedule``'s keys read at ``version`` (1.2.1's rule
    where none is named)."""
    from trtspec.runtime.llm_args import PINNED, rules

    pinned = version if version in PINNED else "1.2.1"
    return str(rules(pinned)["draft_len_schedule"]["keys"])


def check_llm_args(llm: dict[str, Any], version: str | None, path: Path) -> None:
    """Refuse LLM arguments the pinned version's ``LLM(**args)`` would refuse
    (its pydantic models, extra='forbid', and DecodingBaseConfig's validators,
    as ``trtspec.runtime.llm_args`` holds them), as upstream's model fails to load."""
    from trtspec.runtime.llm_args import PINNED, validate_llm_args

    if version not in PINNED:
        return  # no version named (an older repository): nothing to hold it to
    problems = validate_llm_args(llm, version, str(path))
    if problems:
        raise LlmApiConfigError("; ".join(problems))


def speculation_of(
    args: dict[str, Any], where: str, version: str | None = None
) -> Speculation | None:
    sc = args.get("speculative_config")
    if sc is None:
        return None
    kind = sc.get("decoding_type")
    if kind == "NGram":
        spec_kind = "ngram"
    elif kind in DRAFT_TARGET_TYPES:
        spec_kind = "draft"
    else:
        raise LlmApiConfigError(
            f"{where}: speculative_config.decoding_type {kind!r} needs a GPU: the reference "
            "backend serves NGram and Draft_Target (run this flow on backend: tensorrt_llm)"
        )
    schedule = sc.get("draft_len_schedule")
    return Speculation(
        kind=spec_kind,
        max_draft_len=int(sc["max_draft_len"]),
        max_matching_ngram_size=int(sc.get("max_matching_ngram_size", 2)),
        max_concurrency=sc.get("max_concurrency"),
        draft_len_schedule={int(k): int(v) for k, v in schedule.items()} if schedule else None,
        schedule_keys=schedule_keys(version),
    )


def stream_interval_of(args: dict[str, Any], where: str) -> int:
    """The LLM argument ``stream_interval`` (default 1), a positive integer."""
    value = args.get("stream_interval", 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LlmApiConfigError(
            f"{where}: stream_interval must be a positive integer, got {value!r}"
        )
    return value


def answers_at(iteration: int, interval: int) -> bool:
    """Whether a streaming request answers after its ``iteration``-th decoding
    iteration (1-based; its last one always answers)."""
    return iteration == 1 or iteration % interval == 0


def _input(request: Any, name: str, default: Any = None) -> Any:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    array = tensor.as_numpy().reshape(-1)
    if array.size == 0:
        return default
    value = array[0]
    return value.item() if hasattr(value, "item") else value


class TritonPythonModel:
    """The reference engine behind the ``llmapi`` model's tensors."""

    def _configure(self, args: dict[str, Any]) -> tuple[dict[str, Any], Path, Path]:
        """Read and check ``model.yaml`` and the model's settings: (LLM
        arguments, the yaml's path, the model folder)."""
        config = json.loads(args["model_config"])
        self.name = args["model_name"]
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.config = config
        path = Path(args["model_repository"]) / str(args["model_version"]) / "model.yaml"
        llm, triton = read_model_yaml(path)
        if bool(triton["decoupled"]) != self.decoupled:
            raise LlmApiConfigError(
                f"{path}: triton_config.decoupled is {triton['decoupled']} but config.pbtxt's "
                f"transaction policy says {self.decoupled}; make them agree"
            )
        from trtspec.runtime.contract import (
            LLMAPI_ACCEPTANCE_OUTPUTS_PARAMETER,
            LLMAPI_VERSION_PARAMETER,
        )
        from trtspec.runtime.engine.triton_model import _param

        version = _param(config, LLMAPI_VERSION_PARAMETER)
        check_llm_args(llm, version, path)
        self.speculation = speculation_of(llm, str(path), version)
        # 1.2.1's model (zeros) unless trtspec repo named the version's behaviour
        self.acceptance_zeroed = _param(config, LLMAPI_ACCEPTANCE_OUTPUTS_PARAMETER) != "filled"
        self.stream_interval = stream_interval_of(llm, str(path))
        model_dir = Path(str(llm["model"]))
        if not (model_dir / "config.json").is_file():
            raise LlmApiConfigError(
                f"{path}: model {model_dir} is not a reference engine folder; run "
                "`trtspec build` for the spec (on CPU the LLM-API flow serves the reference "
                "engines it builds)"
            )
        self._requests = RequestThreads()
        self._lock = threading.Lock()
        self._in_flight = 0
        self.draft_scheduler: Any = None
        # every response goes out from one thread, as upstream's model sends
        # them (its `_response_thread` over a queue: "allows TRT-LLM to keep
        # making progress while response sender(s) are sending responses";
        # triton_backend/all_models/llmapi/tensorrt_llm/1/model.py at 044a90d2)
        self.responder = Responder(log=pb_utils.Logger.log_error)
        return llm, path, model_dir

    def _load_tokenizer(self, llm: dict[str, Any], model_dir: Path) -> None:
        from trtspec.runtime.text import Tokenizer

        tokenizer_dir = Path(str(llm.get("tokenizer") or model_dir / "tokenizer"))
        self.tokenizer = Tokenizer(tokenizer_dir, add_special_tokens=True)
        self.end_id = self.tokenizer.end_id

    def initialize(self, args: dict[str, Any]) -> None:
        from trtspec.runtime.engine.batching import BatchScheduler
        from trtspec.runtime.engine.decode import ReferenceEngine, default_threads

        llm, path, model_dir = self._configure(args)
        reuse = bool((llm.get("kv_cache_config") or {}).get("enable_block_reuse", True))
        threads = default_threads()
        self.target = ReferenceEngine.load(model_dir, threads=threads, kv_reuse=16 if reuse else 0)
        limits = {
            "max_batch_size": llm.get("max_batch_size"),
            "max_num_tokens": llm.get("max_num_tokens"),
        }
        self.scheduler = BatchScheduler(self.target, **{k: int(v) for k, v in limits.items() if v})
        if self.speculation is not None and self.speculation.kind == "draft":
            sc = llm["speculative_config"]
            draft_dir = sc.get("speculative_model") or sc.get("speculative_model_dir")
            if not draft_dir:
                raise LlmApiConfigError(f"{path}: Draft_Target needs speculative_model")
            draft = ReferenceEngine.load(Path(str(draft_dir)), threads=threads, kv_reuse=16)
            self.draft_scheduler = BatchScheduler(draft)
        self._load_tokenizer(llm, model_dir)

    def execute(self, requests: list) -> None:
        for request in requests:
            self._requests.start(self._serve, request)

    def finalize(self) -> None:
        self._requests.join()
        self.scheduler.close()
        if self.draft_scheduler is not None:
            self.draft_scheduler.close()
        self.responder.close()

    # ---------------------------------------------------------------- serving
    def _serve(self, request: Any) -> None:
        sender = request.get_response_sender()
        cancel = Cancellation.of(request, sender)
        # only the requested outputs: the 2.51 stub would prune the rest without the GIL
        sender = PruningSender.wrap(sender, request, pb_utils.InferenceResponse)
        sender = self.responder.sender(sender)
        with self._lock:
            self._in_flight += 1
        try:
            self._generate(request, sender, cancel)
        except Cancelled:
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except (ParamError, ValueError) as exc:
            sender.send(
                pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(
                        f"{self.name}: {exc}", pb_utils.TritonError.INVALID_ARG
                    )
                ),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
        except Exception as exc:
            sender.send(
                pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"{self.name}: Error generating request: {exc}")
                ),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
        finally:
            with self._lock:
                self._in_flight -= 1
            cancel.close()

    def _generate(self, request: Any, sender: Any, cancel: Cancellation) -> None:
        from trtspec.runtime.engine.decode import GenerationRequest
        from trtspec.runtime.engine.sampling import SamplingParams
        from trtspec.runtime.text import IncrementalText

        text = _input(request, "text_input")
        if text is None:
            raise ValueError("text_input is missing from the request")
        prompt_text = text.decode("utf-8") if isinstance(text, bytes) else str(text)
        streaming = bool(_input(request, "streaming", False))
        if streaming and not self.decoupled:
            raise ValueError("Streaming is only supported in decoupled mode.")
        max_tokens = int(_input(request, "sampling_param_max_tokens", DEFAULT_MAX_TOKENS))
        temperature = float(_input(request, "sampling_param_temperature", 0.0))
        top_k = int(_input(request, "sampling_param_top_k", 0))
        top_p = float(_input(request, "sampling_param_top_p", 1.0))
        seed = int(_input(request, "sampling_param_seed", 0))
        perf = bool(_input(request, "sampling_param_return_perf_metrics", False))
        reason = bool(_input(request, "return_finish_reason", False))
        check_sampling(
            max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed
        )
        prompt = self.tokenizer.encode(prompt_text)
        arrival = time.time_ns()
        times = {"first_scheduled": 0, "first_token": 0}
        out = IncrementalText(self.tokenizer.decode)
        stats = RoundStats()
        held: list[int] = []  # tokens of iterations that did not answer (stream_interval)
        iterations = 0

        def emit(ids: list[int]) -> None:
            nonlocal iterations
            if not ids:
                return
            now = time.time_ns()
            times["first_token"] = times["first_token"] or now
            iterations += 1
            held.extend(ids)
            if streaming and not answers_at(iterations, self.stream_interval):
                return
            out.push(held)
            held.clear()
            if streaming:  # the whole text so far, changed or not (upstream's text_output)
                finish = "None" if reason else None  # str(None) until it finishes
                sender.send(self._response(out.sent, None, arrival, times, perf, finish=finish))

        sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        times["first_scheduled"] = time.time_ns()
        if self.speculation is None:
            gen = self.scheduler.submit(
                GenerationRequest(
                    input_ids=prompt,
                    max_new_tokens=max_tokens,
                    end_id=self.end_id,
                    sampling=sampling,
                ),
                is_cancelled=cancel.is_cancelled,
            )
            for delta in gen:
                if cancel.is_cancelled():
                    raise Cancelled
                emit(list(delta))
        else:
            self._speculate(prompt, max_tokens, sampling, stats=stats, emit=emit, cancel=cancel)
            pb_utils.Logger.log_info(
                f"{self.name}: speculation: {stats.draft_tokens} draft, "
                f"{stats.accepted_tokens} accepted tokens in {stats.rounds} rounds"
            )
        if held:
            out.push(held)
        out.flush()
        finish = None
        if reason:  # CompletionOutput.finish_reason: the end id or the length limit
            finish = "length" if len(out.ids) >= max_tokens else "stop"
        final = self._response(
            out.sent, stats if self.speculation else None, arrival, times, perf, finish=finish
        )
        sender.send(final, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _speculate(
        self,
        prompt: list[int],
        max_tokens: int,
        sampling: Any,
        *,
        stats: RoundStats,
        emit: Any,
        cancel: Cancellation,
    ) -> None:
        from dataclasses import replace

        from trtspec.runtime.engine.decode import GenerationRequest

        spec = self.speculation
        assert spec is not None
        sequence = list(prompt)
        produced = 0
        random = sampling.temperature > 0
        while produced < max_tokens:
            if cancel.is_cancelled():
                raise Cancelled
            remaining = max_tokens - produced
            with self._lock:
                in_flight = self._in_flight
            k = draft_budget(spec.draft_len(in_flight), spec.max_draft_len, remaining)
            seeds = (sampling.seed, sampling.seed)
            if random:
                seeds = (
                    round_seed(sampling.seed, stats.rounds, 0),
                    round_seed(sampling.seed, stats.rounds, 1),
                )
            draft: list[int] = []
            if k > 0 and spec.kind == "ngram":
                draft = propose_ngram(sequence, k, spec.max_matching_ngram_size)
            elif k > 0:
                gen = self.draft_scheduler.generate(
                    GenerationRequest(
                        input_ids=list(sequence),
                        max_new_tokens=k,
                        sampling=replace(sampling, seed=seeds[0]),
                    )
                )
                draft = list(gen.output_ids)[:k]
            gen = self.scheduler.generate(
                GenerationRequest(
                    input_ids=list(sequence),
                    max_new_tokens=len(draft) + 1,
                    end_id=self.end_id,
                    sampling=replace(sampling, seed=seeds[1]),
                    draft_ids=draft or None,
                )
            )
            verified = list(gen.output_ids)
            accepted = min(accepted_count(draft, verified), len(draft))
            stats.record(len(draft), accepted)
            kept = verified
            if self.end_id is not None and self.end_id in kept:
                kept = kept[: kept.index(self.end_id)]
            kept = kept[:remaining]
            sequence.extend(kept)
            produced += len(kept)
            emit(kept)
            if round_finished(draft, verified, self.end_id):
                break

    def _response(
        self,
        text: str,
        stats: RoundStats | None,
        arrival: int,
        times: dict[str, int],
        perf: bool,
        *,
        finish: str | None = None,
    ) -> Any:
        tensors = [
            pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_))
        ]
        if finish is not None:  # with return_finish_reason, as upstream's output_config
            tensors.append(
                pb_utils.Tensor("finish_reason", np.array([finish.encode()], dtype=np.object_))
            )
        if perf:
            values: dict[str, tuple[Any, Any]] = {
                "arrival_time_ns": (arrival, np.int64),
                "first_scheduled_time_ns": (times["first_scheduled"], np.int64),
                "first_token_time_ns": (times["first_token"], np.int64),
                "last_token_time_ns": (time.time_ns(), np.int64),
            }
            if stats is not None:
                zero = self.acceptance_zeroed  # as the pinned model sends them
                values["acceptance_rate"] = (0.0 if zero else stats.acceptance_rate, np.float32)
                values["total_accepted_draft_tokens"] = (
                    0 if zero else stats.accepted_tokens,
                    np.int32,
                )
                values["total_draft_tokens"] = (0 if zero else stats.draft_tokens, np.int32)
            tensors += [
                pb_utils.Tensor(name, np.array([value], dtype=dtype))
                for name, (value, dtype) in values.items()
            ]
        return pb_utils.InferenceResponse(output_tensors=tensors)
