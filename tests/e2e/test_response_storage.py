"""What stored responses may take and what reading them costs, against the real binary: a key
past its `--stored-responses-per-key` quota keeps its newest responses (its oldest are deleted,
docs/security.md), and reading, listing or deleting stored responses counts against the key's
requests per minute (429 `rate_limit_exceeded` with OpenAI's headers)."""

from __future__ import annotations

import subprocess
import uuid

import openai
import pytest

from _util import gantry_bin
from conftest import _models, serving

QUOTA = 2


@pytest.fixture(scope="module")
def srv():
    with serving(_models()[0], ("--stored-responses-per-key", str(QUOTA))) as pair:
        yield pair


def _key(server, *flags: str) -> openai.OpenAI:
    out = subprocess.run([gantry_bin(), "keys", "create", "--name", f"storage-{uuid.uuid4().hex[:8]}", *flags,
                          "--data-dir", server.data_dir], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return openai.OpenAI(base_url=server.base_url, api_key=out.stdout.strip().splitlines()[-1], max_retries=0)


def _ask(client: openai.OpenAI, model: str, text: str, **kw):
    return client.responses.create(model=model, input=text, max_output_tokens=2, temperature=0, **kw)


def test_a_key_past_its_quota_keeps_its_newest_responses_and_no_one_else_loses_any(srv):
    server, _ = srv
    other = _key(server)
    kept_elsewhere = _ask(other, server.model_id, "Say A.")
    key = _key(server)
    ids = [_ask(key, server.model_id, f"Say {i}.").id for i in range(QUOTA + 1)]
    with pytest.raises(openai.NotFoundError):
        key.responses.retrieve(ids[0])
    assert [key.responses.retrieve(i).id for i in ids[1:]] == ids[1:]
    with pytest.raises(openai.BadRequestError) as e:
        _ask(key, server.model_id, "Go on.", previous_response_id=ids[0])
    assert e.value.body["param"] == "previous_response_id"
    assert other.responses.retrieve(kept_elsewhere.id).id == kept_elsewhere.id


def test_reads_of_stored_responses_count_against_the_keys_requests_per_minute(srv):
    server, _ = srv
    key = _key(server, "--rpm", "5")
    first = _ask(key, server.model_id, "Say hi.")
    for _ in range(4):
        key.responses.retrieve(first.id)
    for read in (lambda: key.responses.retrieve(first.id), lambda: key.responses.input_items.list(first.id),
                 lambda: key.responses.delete(first.id)):
        with pytest.raises(openai.RateLimitError) as e:
            read()
        assert e.value.body["code"] == "rate_limit_exceeded", e.value.body
        headers = e.value.response.headers
        assert headers["x-ratelimit-limit-requests"] == "5"
        assert headers["x-ratelimit-remaining-requests"] == "0"
        assert int(headers["retry-after"]) >= 1


def test_a_key_that_spent_its_budget_still_reads_its_stored_responses(srv):
    server, _ = srv
    # Exactly one request's worth: its prompt and its 2 output tokens.
    measured = _ask(_key(server), server.model_id, "Say hi.").usage
    key = _key(server, "--budget-tokens", str(measured.input_tokens + 2), "--budget-period", "total")
    first = _ask(key, server.model_id, "Say hi.")
    assert first.usage.total_tokens == measured.input_tokens + 2, first.usage
    with pytest.raises(openai.RateLimitError) as e:
        _ask(key, server.model_id, "Say more.")
    assert e.value.body["code"] == "insufficient_quota", e.value.body
    # All of it spent, yet reading what it paid for spends nothing: not refused.
    assert key.responses.retrieve(first.id).id == first.id
    assert [item.type for item in key.responses.input_items.list(first.id)] == ["message"]
