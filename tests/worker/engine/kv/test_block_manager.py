"""Block tables, prefix sharing and copy-on-write: never a leaked block, never another sequence's KV."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from worker.engine.kv.block_manager import BlockCopy, BlockManager, NoFreeBlocks

BS = 4


def test_allocate_and_free_counts() -> None:
    bm = BlockManager(10, BS)
    assert bm.allocate(1, list(range(9))) == 0  # 9 tokens: 3 blocks
    assert bm.num_used_blocks == 3 and bm.num_free_blocks == 7 and bm.num_tokens(1) == 9
    bm.free(1)
    assert bm.num_used_blocks == 0 and bm.num_free_blocks == 10
    bm.check_invariants()


def test_shared_prefix_reuses_full_blocks_only() -> None:
    bm = BlockManager(20, BS)
    first = list(range(10))  # 2.5 blocks
    bm.allocate(1, first)
    bm.commit(1, first)
    second = first[:10] + [99, 98]
    assert bm.allocate(2, second) == 2 * BS  # two full blocks reused, the partial third is not
    assert bm.block_table(2)[:2] == bm.block_table(1)[:2]
    assert bm.block_table(2)[2] != bm.block_table(1)[2]
    assert bm.stats.hits == 1 and bm.stats.tokens_hit == 8
    bm.check_invariants()


def test_a_fully_cached_prompt_still_runs_its_last_token() -> None:
    bm = BlockManager(20, BS)
    prompt = list(range(8))  # exactly two blocks
    bm.allocate(1, prompt)
    bm.commit(1, prompt)
    bm.free(1)
    assert bm.allocate(2, prompt) == BS  # the last block is recomputed, so fresh logits exist
    bm.check_invariants()


def test_prefix_block_is_freed_only_when_its_last_user_ends() -> None:
    bm = BlockManager(6, BS, enable_prefix_caching=False)
    bm.allocate(1, list(range(8)))
    bm.fork(1, 2)
    assert bm.num_used_blocks == 2
    bm.free(1)
    assert bm.num_used_blocks == 2  # still referenced by the fork
    bm.free(2)
    assert bm.num_used_blocks == 0
    bm.check_invariants()


def test_copy_on_write_of_a_shared_partial_block() -> None:
    bm = BlockManager(10, BS)
    bm.allocate(1, list(range(6)))  # a full block and a half-full one
    bm.fork(1, 2)
    parent_table = list(bm.block_table(1))
    copies = bm.append_slots(2, 1)
    assert copies == [BlockCopy(parent_table[1], bm.block_table(2)[1])]
    assert bm.block_table(1) == parent_table  # the other sequence keeps its blocks
    assert bm.block_table(2)[0] == parent_table[0]  # the full block stays shared
    assert bm.append_slots(1, 1) == []  # now the parent's last block is its own again
    bm.check_invariants()


def test_cached_blocks_are_evicted_oldest_first_and_then_not_found() -> None:
    bm = BlockManager(4, BS)
    a, b = [1] * 8, [2] * 8
    for sid, tokens in ((1, a), (2, b)):
        bm.allocate(sid, tokens)
        bm.commit(sid, tokens)
        bm.free(sid)
    assert bm.num_free_blocks == 4 and bm.num_used_blocks == 0
    bm.allocate(3, [7] * 8)  # needs two fresh blocks: a's (older) are evicted
    assert bm.stats.evictions == 2
    bm.free(3)
    assert bm.allocate(4, a + [0]) == 0  # a is gone
    bm.free(4)
    bm.check_invariants()


def test_no_free_blocks_changes_nothing() -> None:
    bm = BlockManager(3, BS)
    bm.allocate(1, list(range(8)))
    with pytest.raises(NoFreeBlocks):
        bm.allocate(2, list(range(8)))
    assert not bm.has(2) and bm.num_used_blocks == 2
    bm.append_slots(1, 1)
    with pytest.raises(NoFreeBlocks):
        bm.append_slots(1, 4)
    assert bm.num_tokens(1) == 9
    bm.check_invariants()


def test_use_cache_false_neither_reads_nor_writes_the_cache() -> None:
    bm = BlockManager(10, BS)
    bm.allocate(1, list(range(8)))
    bm.commit(1, list(range(8)))
    assert bm.allocate(2, list(range(9)), use_cache=False) == 0
    assert bm.stats.queries == 1 and bm.stats.hits == 0


class PoolMachine(RuleBasedStateMachine):
    """Random allocate / append / commit / fork / free (preempt, cancel, finish), checked against a model.

    The model is what each block would hold if the caller performed every write and BlockCopy: reading a
    live sequence's table must give back exactly its own tokens, so sharing never corrupts anyone.
    """

    def __init__(self) -> None:
        super().__init__()
        self.bm = BlockManager(24, BS)
        self.contents: dict[int, list[int | None]] = {b: [None] * BS for b in range(24)}
        self.seqs: dict[int, list[int]] = {}  # seq -> its tokens (all written)
        self.next_id = 0

    def _write(self, sid: int, start: int) -> None:
        """Write tokens[start:] of a sequence into its blocks, as the forward pass would."""
        table = self.bm.block_table(sid)
        for pos in range(start, len(self.seqs[sid])):
            self.contents[table[pos // BS]][pos % BS] = self.seqs[sid][pos]

    @rule(tokens=st.lists(st.integers(0, 2), min_size=1, max_size=14), cache=st.booleans())
    def allocate(self, tokens: list[int], cache: bool) -> None:
        sid = self.next_id
        self.next_id += 1
        try:
            computed = self.bm.allocate(sid, tokens, use_cache=cache)
        except NoFreeBlocks:
            return
        assert computed < len(tokens) and computed % BS == 0
        self.seqs[sid] = list(tokens)
        table = self.bm.block_table(sid)
        for pos in range(computed):  # the reused blocks must already hold exactly these tokens
            assert self.contents[table[pos // BS]][pos % BS] == tokens[pos]
        self._write(sid, computed)
        self.bm.commit(sid, tokens)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), extra=st.lists(st.integers(0, 2), min_size=1, max_size=5))
    def append(self, data: st.DataObject, extra: list[int]) -> None:
        sid = data.draw(st.sampled_from(sorted(self.seqs)))
        try:
            copies = self.bm.append_slots(sid, len(extra))
        except NoFreeBlocks:
            return
        for copy in copies:
            self.contents[copy.dst] = list(self.contents[copy.src])
        start = len(self.seqs[sid])
        self.seqs[sid].extend(extra)
        self._write(sid, start)
        self.bm.commit(sid, self.seqs[sid])

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        parent = data.draw(st.sampled_from(sorted(self.seqs)))
        child = self.next_id
        self.next_id += 1
        self.bm.fork(parent, child)
        self.seqs[child] = list(self.seqs[parent])

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(sorted(self.seqs)))
        self.bm.free(sid)
        del self.seqs[sid]

    @rule()
    def reset_cache(self) -> None:
        self.bm.reset_prefix_cache()

    @invariant()
    def consistent(self) -> None:
        self.bm.check_invariants()
        for sid, tokens in self.seqs.items():
            table = self.bm.block_table(sid)
            assert [self.contents[table[p // BS]][p % BS] for p in range(len(tokens))] == tokens

    def teardown(self) -> None:
        for sid in list(self.seqs):
            self.bm.free(sid)
        assert self.bm.num_used_blocks == 0 and self.bm.num_free_blocks == 24
        self.bm.check_invariants()


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None,
                                    suppress_health_check=[HealthCheck.too_slow])
