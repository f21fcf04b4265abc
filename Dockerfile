# The runstate image used by docker-compose.yml (topic setup and worker).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY processor ./processor
# The worker extra: the image runs workers (an agent's own install is plain runstate).
RUN pip install --no-cache-dir '.[worker]'
# A worker is healthy when ready: in its group, its partitions restored, clients healthy
# (GET /readyz). Other commands of the image exit before the first check.
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
  CMD ["python", "-m", "processor.runtime.probe", "readyz"]
ENTRYPOINT []
CMD ["runstate", "--help"]
