"""shared/heap.py: start-up's objects leave the collector's generations (a full collection then skips them)."""

from __future__ import annotations

import gc

from shared.heap import freeze_start_up


def test_start_up_objects_leave_the_collectors_generations() -> None:
    made_before = [object()]  # a tracked container, alive across the freeze
    assert any(o is made_before for o in gc.get_objects())
    freeze_start_up()
    try:
        assert gc.get_freeze_count() > 0
        assert not any(o is made_before for o in gc.get_objects())  # in the permanent generation now
        made_after = [object()]
        assert any(o is made_after for o in gc.get_objects())  # what comes later is collected as usual
    finally:
        gc.unfreeze()
