"""The Triton model repository stage: ``contract`` (the engine tensors per
pinned TensorRT-LLM version), ``configs`` (``ModelConfig`` protobuf builders),
``assemble`` (``assemble(spec, plan, engines_root, output, routing=None)``),
``check`` (``check_repository(path)``), ``routing`` (routing.yaml and the
router's choice) and ``models/`` (the Python-backend model sources).

Kept import-free on purpose: the router and orchestrator stubs import
submodules of this package inside Triton, where every import costs start-up.
"""
