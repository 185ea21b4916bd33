"""``engines/<spec>/<engine>/trtspec.json``: the manifest ``trtspec build``
writes into every engine folder it builds (the spec hash, the steps with
their argv and cache keys, versions, and each file's size and sha256). Its
name and schema version live here; the executor writes it
(``trtspec.build.executor``), ``trtspec.integrity`` reads it and checks the
files, ``trtspec.fingerprint`` and ``trtspec inspect`` read what it records.
A manifest of schema version 1 (before ``files``) is reported by
``trtspec.integrity`` as written by an older trtspec, with the rebuild to run.
"""

from __future__ import annotations

MANIFEST = "trtspec.json"
SCHEMA_VERSION = 2
