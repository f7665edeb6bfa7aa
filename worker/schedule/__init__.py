"""Scheduling: continuous batching over the engine (admission, preemption, speculation, prompt scoring)."""
