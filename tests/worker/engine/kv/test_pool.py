"""The KV pool's element types: the engine's list is the one LLMFLEET_KV_DTYPE offers (the engine imports nothing of
shared/, so the two lists are tied here), and a pool refuses any other."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from shared.settings import KV_DTYPES as SETTING_CHOICES
from shared.settings import Settings, SettingsError
from worker.engine.kv.pool import KV_DTYPE, KV_DTYPES, KVPool


def test_the_setting_offers_exactly_the_dtypes_a_pool_holds() -> None:
    assert SETTING_CHOICES == KV_DTYPES
    assert Settings().kv_dtype == np.dtype(KV_DTYPE).name


def test_the_setting_refuses_a_dtype_no_pool_holds() -> None:
    with pytest.raises(SettingsError, match="LLMFLEET_KV_DTYPE"):
        Settings.from_env({"LLMFLEET_KV_DTYPE": "int8"})


@pytest.mark.parametrize("dtype", KV_DTYPES)
def test_a_pool_holds_each_listed_dtype(tiny_model: Any, dtype: str) -> None:
    pool = KVPool(tiny_model.config, 4, 8, enable_prefix_caching=False, dtype=dtype)
    assert pool.dtype == np.dtype(dtype)


def test_a_pool_refuses_another_dtype(tiny_model: Any) -> None:
    with pytest.raises(ValueError, match="float16, float32"):
        KVPool(tiny_model.config, 4, 8, enable_prefix_caching=False, dtype=np.int8)
