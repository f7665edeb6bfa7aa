"""How many drafts a sequence checks: the best count for its kept-draft estimate, probes when it says none."""

from __future__ import annotations

from worker.schedule.speculation import PROBE_EVERY, NgramProposer, best_draft_count


def test_the_draft_count_grows_with_the_chance_a_draft_is_kept() -> None:
    counts = [best_draft_count(p, 6) for p in (0.05, 0.3, 0.6, 0.8, 0.95)]
    assert counts[0] == 0 and counts[-1] == 6
    assert counts == sorted(counts)
    assert best_draft_count(1.0, 4) == 4


def test_a_sequence_whose_drafts_are_rejected_stops_drafting_but_probes() -> None:
    proposer = NgramProposer()
    for _ in range(20):
        proposer.record(kept=0, rejected=True)
    assert proposer.keep_chance < 0.1
    counts = [proposer.draft_count(6) for _ in range(2 * PROBE_EVERY)]
    assert counts.count(1) == 2 and set(counts) == {0, 1}
    for _ in range(20):
        proposer.record(kept=6, rejected=False)
    assert proposer.draft_count(6) == 6
