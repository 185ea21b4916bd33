"""The Triton model repository stage: ``configs`` (``ModelConfig`` protobuf
builders), ``assemble`` (``assemble(spec, plan, engines_root, output,
routing=None)``) and ``check`` (``check_repository(path)``). What the
repository's models run inside tritonserver lives in ``trtspec.runtime``
(the engine tensors per pinned TensorRT-LLM version in ``runtime.contract``);
the files it reads from other stages (routing.yaml, the rollout state) in
``trtspec.artifacts``.
"""
