"""The benchmark stage: paired, per-route load generation against the variant
orchestrators over tritonclient gRPC streaming, per-request records in
``requests.jsonl``, per-cell statistics in ``summary.json``, decisions in
``routing.yaml``, and the console/Markdown/HTML report. ``run_benchmark`` (in
``runner``) is the entry point; ``render_run`` (in ``report``) re-renders a run
folder from its ``requests.jsonl`` alone."""
