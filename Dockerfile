# The runstate image used by docker-compose.yml (topic setup and worker).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY processor ./processor
RUN pip install --no-cache-dir .
ENTRYPOINT []
CMD ["runstate", "--help"]
