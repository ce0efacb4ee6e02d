# Decidealot, CPU image: CPU torch wheels, non-root, models on the /models volume.
#   docker build -t decidealot .
#   docker run -p 8080:8080 -v decidealot-models:/models decidealot
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# Declared here, used in the build stage: its steps then read the same in both Dockerfiles, so
# a build of one reuses the other's layers when the arguments match.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
WORKDIR /src
# Every version but torch's comes from requirements.lock (.ci/install checks the result).
COPY pyproject.toml README.md LICENSE requirements.lock ./
COPY .ci/install .ci/locked.py .ci/
COPY decidealot decidealot
COPY providers providers
COPY bundles bundles
# Another package index for everything (a mirror, or the local one tests/deploy/test_container.py
# serves); unset, pip's default.
ARG PIP_INDEX_URL
ARG PIP_TRUSTED_HOST
ARG TORCH_INDEX_URL
RUN TORCH_INDEX_URL="$TORCH_INDEX_URL" EXTRAS=otel bash .ci/install /src

FROM ${PYTHON_IMAGE}
RUN groupadd --gid 10001 decidealot \
    && useradd --create-home --uid 10001 --gid 10001 --shell /usr/sbin/nologin decidealot \
    && mkdir /models && chown decidealot:decidealot /models
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    DECIDEALOT_HOST=0.0.0.0 \
    DECIDEALOT_PORT=8080 \
    DECIDEALOT_MODEL_DIR=/models \
    DECIDEALOT_DEVICE=cpu \
    DECIDEALOT_DRAIN_SECONDS=5 \
    HF_HOME=/models/.huggingface
# The drain fits `docker stop`'s default 10 s grace: 5 s for admitted requests, then what is
# left is answered 503 and the process exits 0 before the SIGKILL. Compose
# (deploy/compose/compose.yaml) and Kubernetes set a longer grace and the 120 s drain.
VOLUME ["/models"]
USER 10001:10001
WORKDIR /home/decidealot
EXPOSE 8080
# The first start downloads the bundles before listening: allow it time before counting failures.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30m --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/health', timeout=4)"]
ENTRYPOINT ["decidealot"]
CMD ["serve"]
# Last: every step after it would be one more pass over the 1.5 GB it brings.
COPY --from=build /opt/venv /opt/venv
