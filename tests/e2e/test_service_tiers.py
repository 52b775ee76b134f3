"""Service tiers (issue #56) through the official SDK, against the real binary.

`service_tier` is checked as OpenAI names it; the answer reports the tier the request ran in:
`flex` as asked, `priority` only for a key the operator allows it (others get `default`). A flex
request waits behind every other: with the one sequence busy, a default request sent after a
flex one starts first. Asserted by the order in which first tokens arrive, never by the clock."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

from _util import error_body, httpx
from conftest import _models, serving

ADMIN_TOKEN = "tiers-e2e-admin-token-0123456789abcdef0"


@pytest.fixture(scope="module")
def srv():
    model = _models()[0]
    name = Path(model).stem if model.endswith(".gguf") else model
    # USD per million prompt and completion tokens: flex has no price of its own (half), priority does.
    prices = ("--price", f"{name}=1000,2000", "--price", f"{name}@priority=3000,9000")
    with serving(model, ("--admin-token", ADMIN_TOKEN, *prices), ("--ctx-size", "1024", "--parallel", "1")) as (server, _):
        yield server


def _key(srv, **settings) -> openai.OpenAI:
    body = {"name": settings.pop("name", f"tier-{uuid.uuid4().hex[:8]}"), **settings}
    resp = httpx.post(f"{srv.root_url}/admin/v1/keys", json=body, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60)
    assert resp.status_code == 201, resp.text
    assert resp.json()["priority_tier"] is settings.get("priority_tier", False), resp.text
    return openai.OpenAI(base_url=srv.base_url, api_key=resp.json()["secret"], max_retries=0, timeout=300)


def _ask(srv, client: openai.OpenAI, **extra):
    return client.chat.completions.create(model=srv.model_id, max_tokens=2, temperature=0,
                                          messages=[{"role": "user", "content": "Say hi."}], **extra)


def test_answers_report_the_tier_they_ran_in(srv):
    plain, allowed = _key(srv), _key(srv, priority_tier=True)
    assert _ask(srv, plain).service_tier == "default"
    assert _ask(srv, plain, service_tier="auto").service_tier == "default"
    assert _ask(srv, plain, service_tier="flex").service_tier == "flex"
    assert _ask(srv, plain, service_tier="priority").service_tier == "default", "not allowed: default"
    assert _ask(srv, allowed, service_tier="priority").service_tier == "priority"
    chunks = list(_ask(srv, plain, service_tier="flex", stream=True))
    assert chunks and all(c.service_tier == "flex" for c in chunks), chunks
    response = plain.responses.create(model=srv.model_id, input="Say hi.", max_output_tokens=16, service_tier="flex")
    assert response.service_tier == "flex"
    completion = plain.completions.create(model=srv.model_id, prompt="def add(a, b):", max_tokens=2,
                                         extra_body={"service_tier": "flex"})
    assert completion.usage.completion_tokens == 2


def test_a_tier_openai_does_not_name_is_a_400(srv):
    plain = _key(srv)
    for bad in ("turbo", "Flex", 3):
        with pytest.raises(openai.BadRequestError) as raised:
            _ask(srv, plain, service_tier=bad)
        err = error_body(raised.value.response)
        assert (err["type"], err["param"]) == ("invalid_request_error", "service_tier"), err
    with pytest.raises(openai.BadRequestError) as raised:
        plain.responses.create(model=srv.model_id, input="hi", service_tier="turbo")
    assert error_body(raised.value.response)["param"] == "service_tier"


def test_a_flex_request_waits_behind_a_default_one_sent_after_it(srv):
    client = _key(srv)
    busy = client.chat.completions.create(model=srv.model_id, max_tokens=60, temperature=0, stream=True,
                                          messages=[{"role": "user", "content": "Count from 1 to 100."}],
                                          extra_body={"ignore_eos": True})
    stream = iter(busy)
    next(stream)  # the one sequence is taken
    order, lock = [], threading.Lock()

    def first_token(tier: str) -> None:
        s = client.chat.completions.create(model=srv.model_id, max_tokens=3, temperature=0, stream=True,
                                           service_tier=tier, messages=[{"role": "user", "content": "Say hi."}])
        for chunk in s:
            if chunk.choices and chunk.choices[0].delta.content:
                with lock:
                    order.append(tier)
                break
        s.close()

    with ThreadPoolExecutor(2) as pool:
        flex = pool.submit(first_token, "flex")
        _wait_for_queue(srv, 1)
        default = pool.submit(first_token, "default")
        _wait_for_queue(srv, 2)
        for _ in stream:
            pass
        flex.result(), default.result()
    assert order == ["default", "flex"], order


def _wait_for_queue(srv, depth: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        text = httpx.get(f"{srv.root_url}/metrics", timeout=30).text
        line = next((l for l in text.splitlines() if l.startswith("gantry_requests_waiting ")), "x 0")
        if float(line.split()[-1]) >= depth:
            return
        assert time.monotonic() < deadline, f"the queue never held {depth}: {line}"
        time.sleep(0.05)


def test_each_tier_is_billed_at_its_price(srv):
    name = f"tier-bill-{uuid.uuid4().hex[:6]}"
    client = _key(srv, name=name, priority_tier=True)
    asked = {"default": "default", "flex": "flex", "priority": "priority", "auto": "default"}
    for tier in asked:
        _ask(srv, client, service_tier=tier, extra_headers={"x-request-id": f"{name}-{tier}"})
    ids = {f"{name}-{tier}" for tier in asked}
    deadline = time.monotonic() + 60
    while True:
        resp = httpx.get(f"{srv.root_url}/admin/v1/usage/requests?key_name={name}",
                         headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30)
        rows = {r["client_request_id"]: r for r in resp.json()["data"] if r["client_request_id"] in ids}
        if set(rows) == ids:
            break
        assert time.monotonic() < deadline, rows
        time.sleep(0.2)
    rates = {"default": (1000, 2000), "flex": (500, 1000), "priority": (3000, 9000)}
    for tier, ran_in in asked.items():
        row = rows[f"{name}-{tier}"]
        prompt_rate, completion_rate = rates[ran_in]
        # No cached price was given: cached prompt tokens cost the input rate.
        expected = (row["prompt_tokens"] * prompt_rate + row["completion_tokens"] * completion_rate) / 1e6
        assert row["cost"] == pytest.approx(expected, rel=1e-6), (tier, row)
        assert row["service_tier"] == ran_in, row
    report = httpx.get(f"{srv.root_url}/admin/v1/usage?key_name={name}",
                       headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30).json()["data"]
    assert sorted((r["service_tier"], r["requests"]) for r in report) == [("default", 2), ("flex", 1), ("priority", 1)]


def _running(srv) -> float:
    text = httpx.get(f"{srv.root_url}/metrics", timeout=30).text
    return sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith("gantry_running_sequences"))


def _usage_rows(srv, name: str) -> list[dict]:
    resp = httpx.get(f"{srv.root_url}/admin/v1/usage/requests?key_name={name}",
                     headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30)
    assert resp.status_code == 200, resp.text
    return resp.json()["data"]


def test_an_unstreamed_flex_request_gives_its_sequence_back_unbilled(srv):
    name = f"tier-preempt-{uuid.uuid4().hex[:6]}"
    client = _key(srv, name=name)
    long = {"max_tokens": 400, "temperature": 0, "extra_body": {"ignore_eos": True},
            "messages": [{"role": "user", "content": "Count from 1 to 1000."}]}
    with ThreadPoolExecutor(1) as pool:
        flex = pool.submit(client.chat.completions.create, model=srv.model_id, service_tier="flex",
                           extra_headers={"x-request-id": f"{name}-flex"}, **long)
        deadline = time.monotonic() + 60
        while _running(srv) < 1:
            assert time.monotonic() < deadline and not flex.done(), "the flex request never ran"
            time.sleep(0.05)
        answer = _ask(srv, client, extra_headers={"x-request-id": f"{name}-default"})
        with pytest.raises(openai.RateLimitError) as raised:
            flex.result()
    assert answer.usage.completion_tokens == 2
    response = raised.value.response
    err = error_body(response)
    assert (err["type"], err["code"]) == ("server_error", "resource_unavailable"), err
    assert response.headers.get("retry-after") == "1"
    # Only the default request is on the ledger: the preempted one was not billed.
    deadline = time.monotonic() + 60
    while not (rows := _usage_rows(srv, name)):
        assert time.monotonic() < deadline, "the default request was never booked"
        time.sleep(0.2)
    time.sleep(0.5)
    assert [r["client_request_id"] for r in _usage_rows(srv, name)] == [f"{name}-default"]


def test_a_streamed_flex_request_runs_to_its_end_once_started(srv):
    client = _key(srv)
    stream = iter(client.chat.completions.create(
        model=srv.model_id, max_tokens=40, temperature=0, stream=True, service_tier="flex",
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        messages=[{"role": "user", "content": "Count from 1 to 100."}]))
    next(stream)  # the one sequence is taken
    with ThreadPoolExecutor(1) as pool:
        default = pool.submit(_ask, srv, client)
        _wait_for_queue(srv, 1)
        chunks = list(stream)
        assert default.result().usage.completion_tokens == 2
    usage = next(c.usage for c in chunks if c.usage)
    assert usage.completion_tokens == 40, usage
