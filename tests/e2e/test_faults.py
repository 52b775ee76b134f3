"""A panic in one request's step ends that request alone (issue #33), against the real binary.

`make test`'s build (`cargo build --workspace --all-targets`) gives target/debug/gantry the
engine's fault hooks; `GANTRY_FAULTS=prompt-markers` arms them, and a prompt carrying
`gantry-fault:<point>@<tokens>` then panics its request at that point once it produced that many
tokens. With several streams running, the faulty request gets OpenAI's `server_error` (an error
event in a stream, a 500 otherwise), the ledger bills it what it computed, every other stream
finishes normally and the server goes on serving.

A binary without the hook (a release build) makes these tests skip, saying so; with
GANTRY_REQUIRE_FAULTS=1 (`make test`) they fail instead."""

from __future__ import annotations

import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from _util import collect_stream, error_body, httpx
from conftest import _models, serving

ADMIN_TOKEN = "faults-e2e-admin-token-0123456789abcdef"
ARMED_LOG = "FAULT INJECTION ARMED"
PARALLEL = 4
NEIGHBOURS = PARALLEL - 1
NEIGHBOUR_TOKENS = 16
FAULT_AFTER = 3

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]


@pytest.fixture(scope="module")
def srv():
    saved = os.environ.get("GANTRY_FAULTS")
    os.environ["GANTRY_FAULTS"] = "prompt-markers"
    try:
        ctx = serving(_models()[0], ("--admin-token", ADMIN_TOKEN), ("--ctx-size", "2048", "--parallel", str(PARALLEL)))
        server, _client = ctx.__enter__()
    finally:
        if saved is None:
            os.environ.pop("GANTRY_FAULTS", None)
        else:
            os.environ["GANTRY_FAULTS"] = saved
    try:
        # The warning is logged before the banner the fixture waited for.
        if ARMED_LOG not in server.stderr_tail(400):
            why = "this gantry binary has no fault injection (build it with `cargo build --workspace --all-targets`)"
            if os.environ.get("GANTRY_REQUIRE_FAULTS") == "1":
                pytest.fail(why + "; GANTRY_REQUIRE_FAULTS=1 requires it")
            pytest.skip(why)
        yield server
    finally:
        ctx.__exit__(None, None, None)


def _admin(srv, method: str, path: str, body: dict | None = None):
    return httpx.request(method, f"{srv.root_url}/admin/v1{path}", json=body,
                         headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60)


def _key(srv, name: str) -> openai.OpenAI:
    resp = _admin(srv, "POST", "/keys", {"name": name})
    assert resp.status_code == 201, resp.text
    return openai.OpenAI(base_url=srv.base_url, api_key=resp.json()["secret"], max_retries=0, timeout=300)


def _ledger(srv, key_name: str, ids: set[str]) -> dict[str, dict]:
    """The ledger's rows of `ids` (client request ids), once all are settled."""
    deadline = time.monotonic() + 60
    while True:
        resp = _admin(srv, "GET", f"/usage/requests?key_name={key_name}")
        assert resp.status_code == 200, resp.text
        rows = {r["client_request_id"]: r for r in resp.json()["data"] if r["client_request_id"] in ids}
        if set(rows) == ids:
            return rows
        assert time.monotonic() < deadline, f"the ledger holds {sorted(rows)} of {sorted(ids)}"
        time.sleep(0.2)


def _neighbour(srv, client: openai.OpenAI, rid: str, started: threading.Event):
    stream = client.chat.completions.create(
        model=srv.model_id, temperature=0, max_tokens=NEIGHBOUR_TOKENS, stream=True,
        stream_options={"include_usage": True}, extra_headers={"x-request-id": rid},
        messages=[{"role": "user", "content": "Count from 1 to 200, one number per line."}])
    chunks = iter(stream)
    first = next(chunks)
    started.set()
    res = collect_stream(chunks)
    res.chunks.insert(0, first)
    return res


# Every point streaming; one not (the 500 path is the same for every point).
CASES = [("sampling", True), ("drafting", True), ("watching", True), ("producing", True), ("sampling", False)]


@pytest.mark.parametrize("point,stream", CASES, ids=[f"{p}-{'stream' if s else 'non-stream'}" for p, s in CASES])
def test_a_fault_in_one_request_ends_it_alone(srv, point, stream):
    name = f"faults-{point}-{'s' if stream else 'n'}-{uuid.uuid4().hex[:6]}"
    client = _key(srv, name)
    ids = [f"{name}-n{i}" for i in range(NEIGHBOURS)]
    faulty_id = f"{name}-faulty"
    with ThreadPoolExecutor(NEIGHBOURS) as pool:
        started = [threading.Event() for _ in ids]
        neighbours = [pool.submit(_neighbour, srv, client, rid, ev) for rid, ev in zip(ids, started)]
        for ev, fut in zip(started, neighbours):
            while not ev.wait(0.1):
                if fut.done():
                    fut.result()  # raises what ended it before its first token
        # Every neighbour is decoding: now one request fails beside them.
        body = dict(
            model=srv.model_id, temperature=0, max_tokens=64, tools=TOOLS, tool_choice="auto",
            extra_headers={"x-request-id": faulty_id},
            messages=[{"role": "user", "content": f"Tell me a long story. gantry-fault:{point}@{FAULT_AFTER}"}])
        if stream:
            with pytest.raises(openai.APIError) as raised:
                collect_stream(client.chat.completions.create(stream=True, **body))
            err = raised.value.body
            assert isinstance(err, dict) and set(err) >= {"message", "type", "param", "code"}, err
        else:
            with pytest.raises(openai.InternalServerError) as raised:
                client.chat.completions.create(**body)
            assert raised.value.status_code == 500
            err = error_body(raised.value.response)
        assert err["type"] == "server_error", err
        assert "injected fault" in err["message"] and "not affected" in err["message"], err
        results = [f.result() for f in neighbours]
    for rid, res in zip(ids, results):
        assert res.finish_reasons.get(0) == ["length"], f"{rid}: {res.finish_reasons}"
        assert res.usage is not None and res.usage.completion_tokens == NEIGHBOUR_TOKENS, f"{rid}: {res.usage}"
        assert res.content(), rid

    rows = _ledger(srv, name, {faulty_id, *ids})
    faulty = rows[faulty_id]
    assert faulty["outcome"] == "error", faulty
    assert faulty["completion_tokens"] == FAULT_AFTER, f"billed what it computed: {faulty}"
    assert faulty["prompt_tokens"] > 0, faulty
    for rid in ids:
        assert (rows[rid]["outcome"], rows[rid]["completion_tokens"]) == ("length", NEIGHBOUR_TOKENS), rows[rid]

    # The engine is still up: ready, and answering.
    assert httpx.get(f"{srv.root_url}/health/ready", timeout=30).status_code == 200
    after = client.chat.completions.create(model=srv.model_id, temperature=0, max_tokens=4,
                                           messages=[{"role": "user", "content": "Say hi."}])
    assert after.choices[0].finish_reason in ("stop", "length") and after.usage.completion_tokens > 0
