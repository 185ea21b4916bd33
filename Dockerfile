# The GPU path: trtspec inside the pinned Triton TensorRT-LLM container.
# That image already holds tensorrt_llm 1.1.0, trtllm-build, tritonserver with the
# tensorrtllm backend, and a CUDA torch; trtspec adds only its light
# dependencies (no `cpu` extra: it would replace the container's CUDA torch).
FROM nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3

WORKDIR /opt/trtspec
COPY pyproject.toml README.md ./
COPY toolkit ./toolkit
COPY build_specs ./build_specs
RUN python3 -m pip install --no-cache-dir . \
 && python3 -c "import tensorrt_llm, trtspec; print('tensorrt_llm', tensorrt_llm.__version__)"

# Engines, repositories and results go to mounted volumes.
VOLUME ["/models", "/work"]
WORKDIR /work
ENTRYPOINT ["trtspec"]
CMD ["--help"]
