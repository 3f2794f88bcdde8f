# syntax=docker/dockerfile:1
# brink's image: `brink-agent` (the node agent DaemonSet and the replica Pods' `serve`),
# `brink-operator` and `brink-gateway`, for linux/arm64 (DGX Spark / GB10) and linux/amd64:
#
#   docker buildx build --platform linux/arm64,linux/amd64 -t REGISTRY/brink:TAG --push .
#
# Each platform is compiled natively for itself (an arm64 builder, or QEMU emulation): no
# cross-compiler, and no -C target-cpu: the binaries carry only the baseline ISA of their
# platform; CPU-specific paths in the code are chosen at run time.
#
# At run time brink needs, besides this image:
# - the NVIDIA driver's user-space libraries (libcuda.so.1, libnvidia-ml.so.1), which the NVIDIA
#   container runtime mounts from the host (RuntimeClass `nvidia`, NVIDIA_DRIVER_CAPABILITIES
#   compute,utility); a driver for CUDA 13 (580 or newer; GB10 ships with it);
# - NVRTC 13 (libnvrtc.so.13 and libnvrtc-builtins), which compiles the kernels for the GPU's
#   arch (sm_121 on GB10) when the agent starts: it is not part of the driver, so the image
#   carries it: the CUDA *runtime* image has it (the `base` flavour does not), and the build
#   fails below if it is missing.
# Both are loaded with dlopen: without a GPU the binaries still run (CPU backend, operator).

ARG RUST_VERSION=1.95
ARG CUDA_RUNTIME_IMAGE=nvidia/cuda:13.0.0-runtime-ubuntu24.04

FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
# The lock file is the one CI tests with. Cache mounts keep the registry and target across builds.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p brink-agent -p brink-operator -p brink-gateway \
    && install -D -m 0755 target/release/brink-agent target/release/brink-operator target/release/brink-gateway -t /out/

FROM ${CUDA_RUNTIME_IMAGE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# ca-certificates: model downloads over https verify against the system roots.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
# Fail the build, not the first node, when the base image lacks NVRTC 13.
RUN ldconfig -p | grep -q 'libnvrtc\.so\.13' \
    || { echo "libnvrtc.so.13 is not in ${CUDA_RUNTIME_IMAGE:-the base image}: use a CUDA 13 runtime image" >&2; exit 1; }
# Non-root: uid 10001, the uid the chart runs the operator and agent as; replica Pods use it too.
RUN useradd --uid 10001 --user-group --create-home --home-dir /home/brink --shell /usr/sbin/nologin brink
COPY --from=build /out/brink-agent /out/brink-operator /out/brink-gateway /usr/local/bin/
# Compiled kernels are cached under $HOME/.cache/brink/kernels unless BRINK_KERNEL_CACHE is set.
ENV HOME=/home/brink \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
WORKDIR /home/brink
ENTRYPOINT []
CMD ["brink-agent", "--help"]
