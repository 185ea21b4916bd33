"""The ``postprocessing`` Python model: ``TOKENS_BATCH`` (beam × tokens) and
``SEQUENCE_LENGTH`` → ``OUTPUT`` text per beam. Upstream tensor names, no batch
dimension. Callers that stream send the whole sequence so far and take the
delta themselves (``IncrementalText``), which keeps multi-byte characters
intact; decoding new tokens alone would split them."""

from __future__ import annotations

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from trtspec.procutil import skip_interpreter_teardown
from trtspec.runtime.text import Tokenizer


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        params = json.loads(args["model_config"]).get("parameters", {})
        skip = params.get("skip_special_tokens", {}).get("string_value", "true")
        self.tokenizer = Tokenizer(
            params["tokenizer_dir"]["string_value"],
            skip_special_tokens=skip.strip().lower() in ("1", "true", "yes"),
        )

    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:
            try:
                tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
                tokens = np.atleast_2d(tokens)
                tokens = tokens.reshape(-1, tokens.shape[-1])
                lengths_t = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH")
                lengths = (
                    lengths_t.as_numpy().reshape(-1)
                    if lengths_t is not None
                    else np.full(tokens.shape[0], tokens.shape[1])
                )
                texts = [
                    self.tokenizer.decode([int(t) for t in row[: int(n)]]).encode("utf-8")
                    for row, n in zip(tokens, lengths, strict=False)
                ]
                out = pb_utils.Tensor("OUTPUT", np.array(texts, dtype=np.object_))
                responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
            except Exception as exc:
                responses.append(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError(f"postprocessing: {exc}"))
                )
        return responses

    def finalize(self) -> None:
        skip_interpreter_teardown()  # the stub's exit counts in the server's stop time
