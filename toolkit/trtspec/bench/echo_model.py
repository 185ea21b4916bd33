"""A no-op orchestrator for measuring the benchmark itself: a numpy-only,
decoupled Triton Python model with the orchestrator tensor contract of
docs/design/orchestrator.md that "generates" by echoing the prompt's characters at
a fixed pace, optionally several tokens per round (a simulated speculative
variant whose speed depends on ``num_draft_tokens``) or with a corrupted
output (a simulated lossy variant). ``benchmarks/bench_overhead.py`` drives it
to measure client overhead with no engine in the way; the bench integration
tests use it to exercise the client, pairing and decisions against a real
tritonserver. It never stands in for the real reference engine."""

from __future__ import annotations

from pathlib import Path

from trtspec.runtime.contract import ORCHESTRATOR_INPUTS, ORCHESTRATOR_OUTPUTS

MODEL_SOURCE = '''\
"""trtspec echo orchestrator (no-op engine for benchmarking the client)."""
import os
import sys

# The stub's interpreter ignores PYTHONPATH and would import the base
# interpreter's numpy; a numpy other than the venv's breaks the stub's BYTES
# inputs, so the venv's paths go first before numpy is imported.
for _entry in reversed(os.environ.get("PYTHONPATH", "").split(os.pathsep)):
    if _entry and _entry not in sys.path:
        sys.path.insert(0, _entry)

import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _opt(request, name, default):
    t = pb_utils.get_input_tensor_by_name(request, name)
    return default if t is None else t.as_numpy().reshape(-1)[0]


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        get = lambda k, d: params.get(k, {}).get("string_value", d)
        self.variant = get("variant", args["model_name"])
        self.round_ms = float(get("round_ms", "0"))
        self.max_accept = int(get("max_accept", "0"))
        self.corrupt = get("corrupt", "false") == "true"
        self.threads = []

    def execute(self, requests):
        for request in requests:
            # inputs are read here: their buffers are not valid after execute returns
            args = (request.get_response_sender(),
                    _opt(request, "text_input", b"").decode("utf-8", "replace") or " ",
                    int(_opt(request, "max_tokens", 16)),
                    int(_opt(request, "num_draft_tokens", self.max_accept)))
            t = threading.Thread(target=self._serve, args=args, daemon=True)
            t.start()
            self.threads.append(t)
        self.threads = [t for t in self.threads if t.is_alive()]
        return None

    def _serve(self, sender, text, max_tokens, k):
        start = time.monotonic_ns()
        try:
            per_round = 1 + min(max(k, 0), self.max_accept)
            out = [text[i % len(text)] for i in range(max_tokens)]
            if self.corrupt:
                out = [c.swapcase() if c.isalpha() else "#" for c in out]
            sent, rounds, first_ns, sizes = 0, 0, 0, []
            while sent < max_tokens:
                if self.round_ms:
                    time.sleep(self.round_ms / 1000.0)
                chunk = out[sent : sent + per_round]
                sent += len(chunk)
                rounds += 1
                sizes.append(len(chunk))
                first_ns = first_ns or time.monotonic_ns() - start
                final = sent >= max_tokens
                tensors = [
                    pb_utils.Tensor("text_output", np.array(["".join(chunk).encode()],
                                                            dtype=np.object_)),
                    pb_utils.Tensor("output_ids", np.array([ord(c) for c in chunk],
                                                           dtype=np.int32)),
                    pb_utils.Tensor("is_final", np.array([final], dtype=bool)),
                ]
                if final:
                    drafted = (rounds * (per_round - 1))
                    accepted = max_tokens - rounds
                    ints = {"prompt_tokens": len(text), "completion_tokens": max_tokens,
                            "draft_tokens": drafted, "accepted_tokens": accepted,
                            "rounds": rounds, "prefix_reused_tokens": -1}  # no KV cache
                    tensors += [pb_utils.Tensor(n, np.array([v], dtype=np.int32))
                                for n, v in ints.items()]
                    # each round drafted per_round - 1 tokens, all of its chunk
                    # but the bonus token accepted
                    width = per_round - 1
                    positions = [[rounds] * width,
                                 [sum(1 for n in sizes if n - 1 > j) for j in range(width)]]
                    tensors.append(pb_utils.Tensor(
                        "position_acceptance",
                        np.asarray(positions, dtype=np.int32).reshape(2, width)))
                    tensors += [
                        pb_utils.Tensor("server_ttft_ns", np.array([first_ns], dtype=np.int64)),
                        pb_utils.Tensor("server_total_ns",
                                        np.array([time.monotonic_ns() - start], dtype=np.int64)),
                        pb_utils.Tensor("variant", np.array([self.variant.encode()],
                                                            dtype=np.object_)),
                        pb_utils.Tensor("fallback", np.array([False], dtype=bool)),
                    ]
                flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
                sender.send(pb_utils.InferenceResponse(output_tensors=tensors), flags=flags)
        except Exception as exc:  # report to the client instead of hanging it
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for t in self.threads:
            t.join(timeout=5)
'''


def echo_config(
    name: str,
    *,
    round_ms: float = 0.0,
    max_accept: int = 0,
    corrupt: bool = False,
    instances: int = 1,
) -> str:
    """config.pbtxt text for one echo orchestrator, built as a ModelConfig."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    cfg = mc.ModelConfig(name=name, backend="python", max_batch_size=0)
    cfg.model_transaction_policy.decoupled = True
    # The orchestrator contract, so a router in front of echo models asks for
    # exactly the outputs they declare.
    for t in ORCHESTRATOR_INPUTS:
        cfg.input.add(
            name=t.name,
            data_type=mc.DataType.Value(t.data_type),
            dims=list(t.dims),
            optional=t.optional,
        )
    for t in ORCHESTRATOR_OUTPUTS:
        cfg.output.add(name=t.name, data_type=mc.DataType.Value(t.data_type), dims=list(t.dims))
    cfg.instance_group.add(count=instances, kind=mc.ModelInstanceGroup.KIND_CPU)
    for key, value in (
        ("variant", name),
        ("round_ms", f"{round_ms:g}"),
        ("max_accept", str(max_accept)),
        ("corrupt", str(corrupt).lower()),
    ):
        cfg.parameters[key].string_value = value
    return text_format.MessageToString(cfg)


def write_echo_repository(root: Path, models: dict[str, dict[str, object]]) -> Path:
    """A model repository with one echo orchestrator per entry of ``models``
    (name → keyword arguments of ``echo_config``)."""
    for name, options in models.items():
        folder = root / name
        (folder / "1").mkdir(parents=True, exist_ok=True)
        (folder / "1" / "model.py").write_text(MODEL_SOURCE, encoding="utf-8")
        (folder / "config.pbtxt").write_text(
            echo_config(name, **options),  # type: ignore[arg-type]
            encoding="utf-8",
        )
    return root
