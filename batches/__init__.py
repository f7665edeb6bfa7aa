"""The OpenAI batch API: files in Redis, batches run by `llmfleet batch-runner` (an rq worker) at low priority."""
