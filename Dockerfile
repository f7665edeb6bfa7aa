# One image for every llmfleet role: `llmfleet gateway`, `llmfleet worker --model ...` or `llmfleet batch-runner`.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    LLMFLEET_CACHE=/models

WORKDIR /app
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY worker ./worker
COPY shared ./shared
COPY llmfleet ./llmfleet
COPY batches ./batches
RUN pip install . && useradd --create-home --uid 1000 llmfleet && mkdir -p /models && chown llmfleet /models

USER llmfleet
EXPOSE 8000
CMD ["llmfleet", "gateway", "--host", "0.0.0.0"]
