"""The files ``trtspec repo`` writes at a repository's top and in its router:
``trtspec-repo.json`` (the repository manifest: spec, models and their
roles, the variants' engines; docs/design/repository.md) and
``router/routing.json`` (the routing table the router serves, the installed
form of ``routing.yaml``, ``trtspec.artifacts.routing``). Their names and
the manifest's schema version live here; the generator writes them
(``trtspec.repo.assemble``, ``trtspec.flows.llmapi_repo``),
``trtspec.serve.manifest`` reads the manifest and refuses another schema
version, the router and the rollout read the routing table.
"""

from __future__ import annotations

MANIFEST_NAME = "trtspec-repo.json"
MANIFEST_SCHEMA_VERSION = 1
ROUTING_FILE = "routing.json"  # in the router model's folder
