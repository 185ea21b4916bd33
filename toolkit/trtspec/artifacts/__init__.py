"""The files that cross a stage, one module per file: its name, schema
version, the typed model and its load and atomic save. ``routing``
(``routing.yaml``, written by ``trtspec bench``, read by ``trtspec repo
--routing`` and the router) and ``rollout_state`` (the rollout's
``rollout.json``, ``state.json`` and ``history.jsonl``). Imported inside
tritonserver too, so these modules import only ground-level ones.

Kept import-free on purpose, as ``trtspec.runtime``.
"""
