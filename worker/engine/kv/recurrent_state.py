"""The recurrent state of a hybrid model's sequences: a fixed-size slot per sequence beside the KV pool.

An attention layer's memory grows with the sequence (the KV pool's blocks); a gated delta-net layer's is one
(value heads, Dv, Dk) matrix per sequence that every token rewrites, plus the short convolution's last K-1 inputs.
A slot holds both for every recurrent layer. A slot's state is the sequence's state after exactly `absorbed` tokens:
a step must start a sequence at 0 (the slot is zeroed), where a checkpoint was restored, or exactly where its
state stands; anything else (a prefix the state never saw, a rolled-back draft) is an EngineError, never a wrong
answer. So hybrid pools take no drafts (the scheduler knows) and a forked choice copies its parent's slot. A step
rewrites the slots in place, layer by layer: it cannot stop half-way (model.forward does not interrupt a hybrid
step), and a step that fails half-way leaves its sequences' slots unusable until they restart.

Prefix sharing: a state cannot be cut at any token, so the scheduler keeps copies of it (checkpoints) where a
prompt's prefill reaches a block boundary, keyed by the KV pool's hash chain of the tokens before it (as vLLM's
hybrid prefix caching keeps states at block boundaries). A later prompt whose cached KV blocks reach such a boundary
restores that copy and prefills only the rest: the same bits as a cold prefill, since every token's update is the
same computation. Checkpoints live in extra slots (a quarter of the sequence slots, least recently used first out).

Slots are allocated once (zero pages: memory is committed as slots are first written) and reclaimed from
sequences the KV pool no longer holds.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from worker.engine.errors import EngineError
from worker.engine.formats.config import ModelConfig

STATE_DTYPE = np.float32  # as llama.cpp's recurrent cache keeps it
IN_FLIGHT = -1  # `absorbed` of a sequence whose step has not finished
CHECKPOINTS_PER_SLOTS = 4  # one checkpoint slot for every this many sequence slots (at least one)


class StepEntry(Protocol):
    """What a step tells of one sequence (forward_batch.BatchEntry): its id, where its new tokens start, them."""

    seq_id: int
    start: int
    tokens: Any


class RecurrentStates:
    """Every recurrent layer's state for up to `slots` sequences: the delta-net matrices and convolution tails."""

    def __init__(self, config: ModelConfig, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"a recurrent state pool needs at least 1 slot, got {slots}")
        layers = config.recurrent_layers
        self.slots = slots
        total = slots + checkpoint_slots(slots)
        self.layer_index = {layer: i for i, layer in enumerate(layers)}  # model layer -> its index here
        heads, width = config.delta_value_heads, config.delta_head_dim
        taps, channels = config.conv_kernel - 1, conv_channels(config)
        self.conv = [np.zeros((total, taps, channels), STATE_DTYPE) for _ in layers]  # Lr x (S, K-1, C)
        self.matrices = [np.zeros((total, heads, width, width), STATE_DTYPE) for _ in layers]  # Lr x (S, Hv, Dv, Dk)
        self._slot_of: dict[int, int] = {}
        self._absorbed: dict[int, int] = {}
        self._free = list(range(slots - 1, -1, -1))
        self._checkpoints: OrderedDict[int, int] = OrderedDict()  # chain key -> its slot, least recent first
        self._free_checkpoints = list(range(total - 1, slots - 1, -1))
        self.saved = self.restored = 0  # checkpoints written and used

    @staticmethod
    def bytes_per_sequence(config: ModelConfig) -> int:
        """Bytes one sequence's slot takes across all recurrent layers."""
        per_layer = ((config.conv_kernel - 1) * conv_channels(config)
                     + config.delta_value_heads * config.delta_head_dim ** 2)
        return len(config.recurrent_layers) * per_layer * np.dtype(STATE_DTYPE).itemsize

    @staticmethod
    def total_bytes(config: ModelConfig, slots: int) -> int:
        """Bytes of a pool of `slots` sequence slots and its checkpoint slots."""
        return (slots + checkpoint_slots(slots)) * RecurrentStates.bytes_per_sequence(config)

    @property
    def nbytes(self) -> int:
        """Bytes of every slot."""
        return sum(a.nbytes for a in self.conv) + sum(a.nbytes for a in self.matrices)

    def holds(self, seq_id: int) -> bool:
        """Whether a sequence has a slot."""
        return seq_id in self._slot_of

    def prepare(self, entries: Sequence[StepEntry], live: Callable[[int], bool]) -> np.ndarray:
        """The slot of each entry (B,) int64 for a step about to run: a sequence starting at 0 gets a zeroed slot
        (one held by a sequence `live` denies is reclaimed first); any other must start where its state stands."""
        slots = np.empty(len(entries), np.int64)  # (B,)
        for i, entry in enumerate(entries):
            if entry.start == 0:
                slots[i] = self._fresh(entry.seq_id, live)
            else:
                absorbed = self._absorbed.get(entry.seq_id)
                if absorbed != entry.start:
                    held = "no state" if absorbed is None else (
                        "a state left by a failed step" if absorbed == IN_FLIGHT else f"the state of {absorbed} tokens")
                    raise EngineError(f"sequence {entry.seq_id} starts at position {entry.start}, but its recurrent "
                                      f"layers hold {held}: a hybrid model's sequence runs from its first token")
                slots[i] = self._slot_of[entry.seq_id]
            self._absorbed[entry.seq_id] = IN_FLIGHT
        return slots

    def commit(self, entries: Sequence[StepEntry]) -> None:
        """The step ran to its end: each entry's state now stands after its new tokens."""
        for entry in entries:
            self._absorbed[entry.seq_id] = entry.start + len(entry.tokens)

    def fork(self, parent_id: int, child_id: int, live: Callable[[int], bool]) -> None:
        """A child starts with a copy of its parent's state (a forked choice after the shared prompt)."""
        self._copy(self._slot_of[parent_id], self._fresh(child_id, live, zero=False))
        self._absorbed[child_id] = self._absorbed[parent_id]

    def save(self, seq_id: int, key: int) -> None:
        """Keep a copy of a sequence's state under a chain key (it stands at that key's block boundary); the least
        recently used copy makes room."""
        if key in self._checkpoints:
            self._checkpoints.move_to_end(key)
            return
        if not self._free_checkpoints:
            self._free_checkpoints.append(self._checkpoints.popitem(last=False)[1])
        target = self._checkpoints[key] = self._free_checkpoints.pop()
        self._copy(self._slot_of[seq_id], target)
        self.saved += 1

    def restore(self, seq_id: int, keys: Sequence[int], block_size: int, live: Callable[[int], bool]) -> int:
        """Start a sequence from the deepest kept state among the chain keys of its leading blocks (keys[i] ends
        block i); returns the tokens it stands after (0: none kept, the sequence starts from its first token)."""
        for depth in range(len(keys), 0, -1):
            source = self._checkpoints.get(keys[depth - 1])
            if source is not None:
                self._checkpoints.move_to_end(keys[depth - 1])
                self._copy(source, self._fresh(seq_id, live, zero=False))
                self._absorbed[seq_id] = depth * block_size
                self.restored += 1
                return depth * block_size
        return 0

    def _copy(self, source: int, target: int) -> None:
        """Slot `target` becomes a copy of slot `source`, every layer."""
        for conv, matrices in zip(self.conv, self.matrices):
            conv[target] = conv[source]  # (K-1, C)
            matrices[target] = matrices[source]  # (Hv, Dv, Dk)

    def release(self, seq_id: int) -> None:
        """Give a sequence's slot back (nothing when it holds none)."""
        slot = self._slot_of.pop(seq_id, None)
        self._absorbed.pop(seq_id, None)
        if slot is not None:
            self._free.append(slot)

    def _fresh(self, seq_id: int, live: Callable[[int], bool], *, zero: bool = True) -> int:
        """A slot for a sequence (its own, when it holds one), zeroed unless the caller overwrites it."""
        slot = self._slot_of.get(seq_id)
        if slot is None:
            if not self._free:
                for held in [s for s in self._slot_of if s != seq_id and not live(s)]:
                    self.release(held)
            if not self._free:
                raise EngineError(f"all {self.slots} recurrent state slots are held by running sequences")
            slot = self._slot_of[seq_id] = self._free.pop()
        for conv, matrices in zip(self.conv, self.matrices) if zero else ():
            conv[slot] = 0.0  # (K-1, C)
            matrices[slot] = 0.0  # (Hv, Dv, Dk)
        return slot


def checkpoint_slots(slots: int) -> int:
    """Checkpoint slots beside `slots` sequence slots."""
    return max(1, slots // CHECKPOINTS_PER_SLOTS)


def conv_channels(config: ModelConfig) -> int:
    """Channels of a recurrent layer's short convolution: queries, keys and values side by side."""
    return (2 * config.delta_key_heads + config.delta_value_heads) * config.delta_head_dim
