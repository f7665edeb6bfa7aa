"""SchedulerConfig's defaults are Settings' (written once, in shared/settings.py), but the host KV tier, which a
scheduler built without settings leaves off; a worker's config is its settings, field by field."""

from __future__ import annotations

import dataclasses

from shared.settings import Settings
from worker.schedule.scheduler_config import SchedulerConfig


def test_the_defaults_are_the_settings_defaults_but_the_host_tier() -> None:
    deployed = SchedulerConfig.from_settings(Settings())
    assert deployed.kv_tier_mib == Settings().kv_tier_mib > 0
    assert dataclasses.replace(deployed, kv_tier_mib=0.0) == SchedulerConfig()


def test_a_worker_config_carries_each_setting() -> None:
    settings = Settings.from_env({"LLMFLEET_SLOTS": "3", "LLMFLEET_MAX_BATCH_TOKENS": "100",
                                  "LLMFLEET_MAX_PREFILL_TOKENS": "50", "LLMFLEET_KV_BUDGET_MIB": "12",
                                  "LLMFLEET_KV_DTYPE": "float32", "LLMFLEET_PREFIX_CACHE": "0",
                                  "LLMFLEET_QUEUE_LIMIT": "7", "LLMFLEET_KV_TIER_MIB": "0",
                                  "LLMFLEET_KV_TIER_DIR": "/tmp/tier", "LLMFLEET_KV_COMMIT_AHEAD_MIB": "64"})
    config = SchedulerConfig.from_settings(settings)
    assert (config.max_sequences, config.max_batch_tokens, config.max_prefill_tokens, config.kv_budget_mib,
            config.kv_dtype, config.prefix_cache, config.max_queue, config.kv_tier_mib, config.kv_tier_dir,
            config.kv_commit_ahead_mib) == (3, 100, 50, 12.0, "float32", False, 7, 0.0, "/tmp/tier", 64.0)
