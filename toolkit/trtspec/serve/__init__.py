"""Serving a model repository under tritonserver (``trtspec.serve``).

One supervisor for the CLI, the benchmark and the tests: ``discovery`` finds
tritonserver and prepares what the nvidia-pytriton build needs on a CPU
machine, ``manifest`` reads which models a variant needs from
``trtspec-repo.json``, ``launch`` builds the command lines (one server, or
leader or orchestrator mode for TP×PP > 1), ``supervisor`` runs, watches and
stops the server, ``guard`` cleans up after an owner that died and
``watchdog`` notices dead stubs and restarts the server. This module
re-exports the public names.
"""

from trtspec.serve.discovery import (
    OPT_BIN,
    TritonInstall,
    cache_root,
    find_tritonserver,
    prepare_backend_dir,
    pytriton_server_dir,
    wheel_env,
)
from trtspec.serve.launch import (
    ORCHESTRATOR_ENV,
    launch_mode,
    leader_mode_argv,
    orchestrator_mode_argv,
    server_argv,
)
from trtspec.serve.manifest import (
    MANIFEST_NAME,
    MANIFEST_SCHEMA_VERSION,
    detect_world_size,
    engine_folders,
    engine_models,
    fallback_covered,
    read_manifest,
    resolve_repo,
    variant_models,
    verify_engines,
)
from trtspec.serve.supervisor import (
    Server,
    free_ports,
    group_members,
    log_errors,
    remove_shm_regions,
    remove_stale_shm_regions,
)
from trtspec.serve.watchdog import Incident, StubWatchdog, stubs_of

__all__ = [
    "MANIFEST_NAME",
    "MANIFEST_SCHEMA_VERSION",
    "OPT_BIN",
    "ORCHESTRATOR_ENV",
    "Incident",
    "Server",
    "StubWatchdog",
    "TritonInstall",
    "cache_root",
    "detect_world_size",
    "engine_folders",
    "engine_models",
    "fallback_covered",
    "find_tritonserver",
    "free_ports",
    "group_members",
    "launch_mode",
    "leader_mode_argv",
    "log_errors",
    "orchestrator_mode_argv",
    "prepare_backend_dir",
    "pytriton_server_dir",
    "read_manifest",
    "remove_shm_regions",
    "remove_stale_shm_regions",
    "resolve_repo",
    "server_argv",
    "stubs_of",
    "variant_models",
    "verify_engines",
    "wheel_env",
]
