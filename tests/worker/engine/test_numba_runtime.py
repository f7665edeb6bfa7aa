"""worker.engine.numba_runtime: small steps run their kernels on one thread and give the thread count back; the
results do not depend on it (test_batch_invariance's token-by-token prefill runs on one thread, its one-chunk
prefill on all, and their logits are compared bit for bit)."""

from __future__ import annotations

import numba
import pytest

from worker.engine.numba_runtime import SINGLE_THREAD_ROWS, threads_for_step


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="numba sees one core here: nothing to narrow")
def test_a_small_step_runs_on_one_thread_and_gives_the_threads_back() -> None:
    before = numba.get_num_threads()
    assert before > 1
    with threads_for_step(SINGLE_THREAD_ROWS):
        assert numba.get_num_threads() == 1
    assert numba.get_num_threads() == before
    with threads_for_step(SINGLE_THREAD_ROWS + 1):
        assert numba.get_num_threads() == before


def test_threads_come_back_after_an_error() -> None:
    before = numba.get_num_threads()
    with pytest.raises(RuntimeError), threads_for_step(1):
        raise RuntimeError("a step that failed")
    assert numba.get_num_threads() == before
