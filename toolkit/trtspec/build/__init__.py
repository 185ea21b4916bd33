"""Executing a build plan: ``trtllm`` (TensorRT-LLM command lines), ``executor``
(the one subprocess chokepoint, staging, cache, manifests), ``inspect``
(reading an engine folder back), ``tools`` (small step helpers run as
``python -m trtspec.build.tools``) and ``reference`` (the CPU engine builder)."""
