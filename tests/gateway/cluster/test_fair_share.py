"""gateway/cluster/fair_share.py and gateway/http/tenants.py: a job's token work, and whose turn it is queued in."""

from __future__ import annotations

import contextvars
import time

from gateway.cluster.fair_share import job_cost
from gateway.http.api_keys import KeyRecord, current_key
from gateway.http.tenants import ANONYMOUS, current_tenant, note_requested
from shared.messages import ChatMessage, EmbedJob, GenerateJob, TextJob


def _job(**fields: object) -> GenerateJob:
    now = time.time()
    return GenerateJob(id="r", model="m", created=now, deadline=now + 60, **fields)


def test_token_work_is_the_estimated_prompt_plus_every_choices_output() -> None:
    assert job_cost(_job(prompt="x" * 400, max_tokens=50, n=2)) == 100 + 100
    assert job_cost(_job(messages=[ChatMessage(role="user", content="y" * 40)], max_tokens=None)) == 10 + 256
    assert job_cost(_job(prompt_token_ids=[1, 2, 3], max_tokens=0)) == 3
    assert job_cost(EmbedJob(id="e", model="m", created=0, deadline=1, inputs=["z" * 80, "w" * 8])) == 22
    assert job_cost(TextJob(id="t", model="m", created=0, deadline=1, operation="tokenize", content="q")) == 1


def test_the_key_decides_the_tenant_and_its_weight() -> None:
    def tenant_of(key: KeyRecord | None, *named: str) -> tuple[str, float]:
        if key is not None:
            current_key.set(key)
        for name in named:
            note_requested(name)
        return current_tenant()

    batch = KeyRecord("batch", "digest", weight=0.25)
    assert contextvars.Context().run(tenant_of, batch, "someone-else") == ("batch", 0.25)
    assert contextvars.Context().run(tenant_of, None, "header-name", "body-user") == ("header-name", 1.0)
    assert contextvars.Context().run(tenant_of, None, "", "body-user") == ("body-user", 1.0)
    assert contextvars.Context().run(tenant_of, None) == (ANONYMOUS, 1.0)
