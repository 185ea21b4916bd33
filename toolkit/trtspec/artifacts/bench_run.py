"""The files of one benchmark run folder (``bench_results/<spec>-<time>/``):
``run.json`` (what ran: spec, server, fingerprint; written first, completed
at the end), ``requests.jsonl`` (one row per measured request, schema
``REQUEST_SCHEMA_VERSION``; ``trtspec.bench.records`` holds the row's fields
and reader), ``summary.json`` (per-cell statistics and the decisions, schema
``SUMMARY_SCHEMA_VERSION``; built by ``trtspec.bench.summary``, read by
``trtspec compare`` and ``trtspec deploy``) and ``routing.yaml``
(``trtspec.artifacts.routing``). Their names and schema versions live here.
"""

from __future__ import annotations

RUN_FILE = "run.json"
REQUESTS_FILE = "requests.jsonl"
REQUEST_SCHEMA_VERSION = 1
SUMMARY_FILE = "summary.json"
SUMMARY_SCHEMA_VERSION = 1
