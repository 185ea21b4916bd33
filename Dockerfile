# The GPU path: trtspec inside the pinned Triton TensorRT-LLM container.
# That image already holds tensorrt_llm, trtllm-build, tritonserver with the
# tensorrtllm backend, and a CUDA torch; trtspec adds only its light
# dependencies (no `cpu` extra: it would replace the container's CUDA torch).
# The default tag is stack.triton_image's default (TensorRT-LLM 1.1.0); for the
# 1.2.1 pin build with --build-arg TRITON_IMAGE=nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3.
ARG TRITON_IMAGE=nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3
FROM ${TRITON_IMAGE}

WORKDIR /opt/trtspec
COPY pyproject.toml README.md ./
COPY toolkit ./toolkit
COPY build_specs ./build_specs
# `docker build` has no GPU: importing tensorrt_llm there initialises CUDA and
# fails, so the installed version is read from the package metadata instead.
RUN python3 -m pip install --no-cache-dir . \
 && python3 -c "import importlib.metadata as m; import trtspec; print('tensorrt_llm', m.version('tensorrt_llm'))"

# Engines, repositories and results go to mounted volumes.
# Multi-node `trtspec deploy k8s` groups start their ranks over SSH: the workers
# run sshd as the container user, the leader's mpirun connects with ssh.
RUN apt-get update \
 && apt-get install -y --no-install-recommends openssh-client openssh-server \
 && rm -rf /var/lib/apt/lists/*
# Run as the image's non-root user: NGC Triton images create triton-server
# with uid/gid 1000 (Triton's build.py checks it); `trtspec deploy k8s` pods
# run as that uid under the restricted pod security standard.
RUN mkdir -p /models /work && chown 1000:1000 /models /work
VOLUME ["/models", "/work"]
WORKDIR /work
USER 1000:1000
# NVIDIA's entrypoint first: it prints the licence banner, checks the driver and
# sets up the CUDA compat libraries before trtspec runs.
ENTRYPOINT ["/opt/nvidia/nvidia_entrypoint.sh", "trtspec"]
CMD ["--help"]
