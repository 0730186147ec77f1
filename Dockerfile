# A Beam worker image with picasso and its C++ kernels built in: pass it to the pipeline as
# --sdk_container_image (Dataflow, Flink and Spark's portable runners), with no --setup_file.
# Built on the Beam Python SDK image of the apache-beam that the driver runs: the SDK on
# both sides must match, and the set-up installs whichever apache-beam is newest, so the
# version is the build's argument, with no default (README: the build command passes the
# driver's own).
ARG BEAM_VERSION
FROM apache/beam_python3.11_sdk:${BEAM_VERSION}

# CPU workers: torch's CPU build (PyPI's Linux torch is the CUDA one, several GB). A build
# argument, so it is in the environment of the RUN lines only, not of the image; set it
# empty (--build-arg PIP_EXTRA_INDEX_URL=) for PyPI's torch.
ARG PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
# One kernel folder for the build below and for the worker, whatever its user and $HOME,
# built for a portable instruction set rather than this machine's (-march=native): the
# workers' CPUs are not the image builder's. x86-64-v3 (AVX2) runs on every x86 server CPU of
# the last decade; set it to x86-64-v2 for older ones.
ENV PICASSO_KERNEL_CACHE=/opt/picasso/kernel-cache \
    PICASSO_KERNEL_MARCH=x86-64-v3

WORKDIR /opt/picasso/src
COPY . .
# README.md's set-up command for a worker image (no test and bench extras).
RUN pip install torch==2.13.0 && pip install -e .
# The editable install leaves the kernels to first use; build them into the image now.
RUN python -m picasso.kernels.build

ENTRYPOINT ["/opt/apache/beam/boot"]
