"""Fixtures of the batch tests (the Redis clients, aredis and sredis, are tests/support/batches.py's)."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    """Run async tests on asyncio only."""
    return "asyncio"
