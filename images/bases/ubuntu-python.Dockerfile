# A made base for the GPU images: a digest-pinned CUDA image plus the distribution's CPython.
# Built by `halo image base` in the fetch phase (the only phase that may use the network);
# images built on it run with --network none.
ARG FROM
FROM ${FROM}
ARG PYTHON=python3.12
# The catalog's `packages` of the base (g++ for the JIT compilers in GPU images: DeepEP's
# kernels and Triton's launchers are compiled at first use).
ARG PACKAGES=""
# Unpinned apt versions (DL3008): this runs once, in the fetch phase, and the made base
# enters every image's input hash by its image ID, so what it installed is pinned by content.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends "${PYTHON}" "${PYTHON}-venv" ca-certificates ${PACKAGES} \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/apt /var/log/dpkg.log
# Mount points every build step mounts something on (/dev, /etc/hosts, hostname, resolv.conf),
# empty: without them BuildKit leaves a stub with the build's time in each RUN step's layer.
COPY mount-points/ /
