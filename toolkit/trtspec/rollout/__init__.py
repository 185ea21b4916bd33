"""Rolling a benchmark's decision out to live traffic, on the operator's side
(docs/design/rollout.md): ``compare`` (canary vs control over a window of the
request log, with a speedup interval and the bench's thresholds), ``golden``
(each route's golden set, rendered for ``trtspec repo``) and ``manage``
(``trtspec rollout`` status/advance/rollback/history without Click). What
runs inside the router lives in ``trtspec.repo`` (``rollout_state``,
``rollout_window``, ``rollout_config``, ``models/rollout_live``,
``models/rollout_log``, ``models/rollout_metrics``), because ``repo`` must
not import this package (it imports ``bench``, which imports ``repo``).
"""
