"""What runs inside tritonserver: the Python-backend models (``models/``:
preprocessing, postprocessing, the per-variant orchestrator, the router and
its rollout, the LLM-API adapter), the reference engine (``engine/``) and
their helpers (``cancel``, ``heartbeat``, ``health``, ``limits``,
``speculate``, ``threads``, ``text``, ``in_flight``, ``rollout_window``, the
engine tensor ``contract``, ``model_config``). It imports nothing from the
build side (spec, modes, plan, build, repo, serve, bench, flows, deploy,
cli): only ground-level modules and ``trtspec.artifacts``
(``tests/unit/test_layering.py`` holds the rule). The repository generator
names these modules in each model's ``1/model.py``.

Kept import-free on purpose: a stub imports the submodules it needs, and every
import costs start-up inside Triton.
"""
