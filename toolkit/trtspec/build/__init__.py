"""Executing a build plan (whose TensorRT-LLM command lines come from
``trtspec.trtllm_argv``): ``executor``
(the one subprocess chokepoint, staging, cache, manifests), ``inspect``
(reading an engine folder back), ``tools`` (small step helpers run as
``python -m trtspec.build.tools``) and ``reference`` (the CPU engine builder)."""
