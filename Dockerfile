# The runstate image used by docker-compose.yml (topic setup and worker). Its base is a
# build argument: the official Python image by default, or the one `make images` builds
# from Debian's packages where no registry answers (it sets RUNSTATE_PYTHON_IMAGE).
ARG BASE=python:3.11-slim
FROM ${BASE}
# Extra CAs for a TLS-intercepting proxy between the build and PyPI (deploy/images/ca).
COPY deploy/images/ca/ /usr/local/share/ca-certificates/
# Graphviz lays out the inspector's machine diagrams (processor/serving/graphviz.py).
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends graphviz \
 && rm -rf /var/lib/apt/lists/*
RUN update-ca-certificates >/dev/null \
 && useradd --system --uid 10001 --create-home --shell /usr/sbin/nologin runstate \
 && mkdir -p /state /keys /http-auth \
 && chown runstate /state /keys /http-auth \
 && python3 -m venv /opt/runstate
ENV PATH=/opt/runstate/bin:$PATH PYTHONUNBUFFERED=1 \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt
WORKDIR /app
# The pinned dependencies first: this layer is kept until the pins change.
COPY deploy/images/constraints.txt ./
RUN pip install --no-cache-dir --quiet -r constraints.txt
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY processor ./processor
# The worker extra: the image runs workers (an agent's own install is plain runstate).
RUN pip install --no-cache-dir --quiet --no-deps -c constraints.txt '.[worker]' \
 && pip check
USER runstate
# Each container keeps its stores in a volume of its own (compose --scale gives each
# replica one): a worker locks its state directory.
VOLUME /state
# A worker is healthy when ready: in its group, its partitions restored, clients healthy
# (GET /readyz). Other commands of the image exit before the first check.
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
  CMD ["python3", "-m", "processor.runtimes.native.probe", "readyz"]
ENTRYPOINT []
CMD ["runstate", "--help"]
