"""Fair shares on a full worker (shared/fair_queue.py): a newcomer (a tenant with nothing waiting in a saturated
class, sent up a class by the fair queue) ranks between its class and the one above, so it preempts the most recently
admitted job of its own class, prefills alone and starts at once; the job it preempted resumes with exactly the
tokens it would have made. A newcomer whose tenant already holds an equal share of the class waits as any job."""

from __future__ import annotations

from typing import Any

from tests.worker.schedule.test_priority_preemption import _alone, _busy, _prompt, _request, _tokens
from worker.schedule.preemption import job_rank
from worker.schedule.scheduler import SchedulerConfig
from worker.schedule.sequences import GenerationRequest, Priority


def _tenant(request: GenerationRequest, tenant: str, *, newcomer: bool = False) -> GenerationRequest:
    request.tenant, request.newcomer = tenant, newcomer
    return request


def test_a_newcomer_preempts_its_classs_latest_and_starts_at_once(tiny_engine: Any) -> None:
    burst = [_tenant(_request(f"a{i}", _prompt(tiny_engine, 20, i), 30, Priority.NORMAL, i), "A") for i in range(4)]
    sched, out = _busy(tiny_engine, SchedulerConfig(max_sequences=4, prefix_cache=False), burst)
    single = _tenant(_request("b0", _prompt(tiny_engine, 20, 50), 6, Priority.NORMAL), "B", newcomer=True)
    assert sched.admission.below_share("B", Priority.NORMAL)  # B holds nothing of the class
    sched.add(single)
    assert _tokens(sched.step(), out) == {"b0"}  # its prefill went alone: its first token in the very next step
    assert sched.stats.preemptions == 1
    while sched.has_work:
        _tokens(sched.step(), out)
    assert out["b0"] == _alone(tiny_engine, single)
    for request in burst:  # a3, the latest admitted, was preempted and recomputed: the same tokens
        assert out[request.request_id] == _alone(tiny_engine, request), request.request_id


def test_a_newcomer_ranks_between_its_class_and_the_one_above() -> None:
    assert job_rank(Priority.NORMAL, False) < job_rank(Priority.NORMAL, True) < job_rank(Priority.HIGH, False)


def test_a_tenant_at_its_share_is_no_newcomer(tiny_engine: Any) -> None:
    mixed = [_tenant(_request(f"r{i}", _prompt(tiny_engine, 20, i), 30, Priority.NORMAL, i), "AB"[i // 3])
             for i in range(4)]  # A holds 3 slots, B 1
    sched, _out = _busy(tiny_engine, SchedulerConfig(max_sequences=4, prefix_cache=False), mixed)
    assert not sched.admission.below_share("A", Priority.NORMAL)  # 3 of 4 slots > an equal share of 2
    assert sched.admission.below_share("B", Priority.NORMAL)  # 1 of 4 < 2
    assert sched.admission.below_share("C", Priority.NORMAL)  # 0 < 4/3
    assert sched.admission.below_share("A", Priority.HIGH)  # another class
