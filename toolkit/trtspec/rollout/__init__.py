"""Rolling a benchmark's decision out to live traffic (docs/internals.md §8a):
``state`` (the router's rollout settings, the per-route step and the history
of changes, re-read by the router without a restart), ``log`` (the
per-request JSON-lines log, written off the request path), ``metrics`` (the
router's Prometheus series through Triton's custom-metrics API), ``window``
(canary vs control over a window of requests, with the bench's thresholds),
``live`` (what the router does per request: log, metrics, watch, golden diff,
automatic rollback) and ``golden`` (the golden set written at ``trtspec
repo`` time). Stdlib-only at import time except ``golden``: the router model
imports the rest inside a Python backend stub.
"""
