"""Python-backend model sources served from a trtspec repository:
``preprocessing``/``postprocessing`` (tokenizer), ``orchestrator`` (one per
variant: the draft → verify loop or in-engine forwarding, streaming deltas and
per-request stats) and ``router`` (route → variant, canary, fallback). Each
model folder's ``1/model.py`` imports its ``TritonPythonModel`` from here."""
