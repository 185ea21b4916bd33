"""trtspec: build TensorRT-LLM speculative-decoding engines from one YAML spec,
serve them under Triton, and benchmark every variant against the target-only
baseline per request type ("route")."""

__version__ = "0.1.0"
