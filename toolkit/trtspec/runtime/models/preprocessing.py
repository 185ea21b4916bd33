"""The ``preprocessing`` Python model: ``QUERY`` text → ``INPUT_ID`` token ids,
their length, and the tokenizer's end/pad ids. Upstream tensor names, no batch
dimension (``max_batch_size: 0``); the tokenizer folder comes from the
``tokenizer_dir`` parameter (the target engine's ``tokenizer/``)."""

from __future__ import annotations

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from trtspec.procutil import skip_interpreter_teardown
from trtspec.runtime.text import Tokenizer


def _flag(params: dict, key: str, default: bool) -> bool:
    value = params.get(key, {}).get("string_value", "")
    return default if value == "" else value.strip().lower() in ("1", "true", "yes")


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        params = json.loads(args["model_config"]).get("parameters", {})
        self.tokenizer = Tokenizer(
            params["tokenizer_dir"]["string_value"],
            add_special_tokens=_flag(params, "add_special_tokens", True),
        )

    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:
            try:
                query = pb_utils.get_input_tensor_by_name(request, "QUERY").as_numpy()
                text = query.reshape(-1)[0]
                text = text.decode("utf-8") if isinstance(text, bytes) else str(text)
                out_len = pb_utils.get_input_tensor_by_name(request, "REQUEST_OUTPUT_LEN")
                ids = np.asarray(self.tokenizer.encode(text), dtype=np.int32)
                end_id = self.tokenizer.end_id if self.tokenizer.end_id is not None else -1
                outputs = [
                    pb_utils.Tensor("INPUT_ID", ids),
                    pb_utils.Tensor("REQUEST_INPUT_LEN", np.array([ids.size], dtype=np.int32)),
                    pb_utils.Tensor(
                        "REQUEST_OUTPUT_LEN", out_len.as_numpy().astype(np.int32).reshape(1)
                    ),
                    pb_utils.Tensor("OUT_END_ID", np.array([end_id], dtype=np.int32)),
                    pb_utils.Tensor(
                        "OUT_PAD_ID", np.array([self.tokenizer.pad_id], dtype=np.int32)
                    ),
                ]
                responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
            except Exception as exc:  # one bad request must not fail the batch
                responses.append(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError(f"preprocessing: {exc}"))
                )
        return responses

    def finalize(self) -> None:
        skip_interpreter_teardown()  # the stub's exit counts in the server's stop time
