"""Test machinery in one place: process clusters (cluster.py, warm_pool.py, on llmfleet/local_cluster.py),
waiting and stopping processes (processes.py), batch fixtures (batches.py), tiny GGUF models and LoRA
adapters (tiny_gguf.py, lora_gguf.py), a worker job's events (job_events.py); fixtures.py is the pytest
plugin that tests/conftest.py registers."""
