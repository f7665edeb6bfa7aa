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
# libgomp1: numba's OpenMP threading layer (the compiled kernels run at about half speed on its fallback)
RUN apt-get update && apt-get install -y --no-install-recommends libgomp1 && rm -rf /var/lib/apt/lists/*
RUN pip install . && useradd --create-home --uid 1000 llmfleet && mkdir -p /models && chown llmfleet /models
# compile the engine's kernels into numba's cache beside the installed sources, so no worker compiles at start
RUN python -c "from worker.engine.kernels.layer_kernels import warm_up; warm_up()"

USER llmfleet
EXPOSE 8000
# 0.0.0.0 so a published port reaches it: it starts only with an API key (LLMFLEET_API_KEY / LLMFLEET_KEYS_FILE),
# LLMFLEET_PUBLISHED_HOST=127.0.0.1 when the port is published on loopback only, or LLMFLEET_ALLOW_OPEN=1
CMD ["llmfleet", "gateway", "--host", "0.0.0.0"]
