"""A key flooding the queue does not starve another key (issue #33), against the real binary.

Key A keeps about 40 streaming requests queued on a server with two sequences; key B sends one
meanwhile. Waiting requests are queued per key and keys take turns, so B's request starts after
at most one round of A's (the ones already running, plus one more), not after A's whole backlog.
Asserted by the order in which first tokens arrive, never by the clock.

And a key that sends requests and cancels them while they wait still spends its requests per
minute: the next one over its `rpm_limit` is a 429 `rate_limit_exceeded`."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from _util import error_body, gantry_bin, httpx
from conftest import _models, serving

ADMIN_TOKEN = "fairness-e2e-admin-token-0123456789abcdef"
PARALLEL = 2
FLOOD = 40


@pytest.fixture(scope="module")
def srv():
    with serving(_models()[0], ("--admin-token", ADMIN_TOKEN), ("--ctx-size", "1024", "--parallel", str(PARALLEL))) as (server, _):
        yield server


def _key(srv, body: dict) -> tuple[str, openai.OpenAI]:
    body = {"name": f"fair-{uuid.uuid4().hex[:8]}", **body}
    resp = httpx.post(f"{srv.root_url}/admin/v1/keys", json=body, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60)
    assert resp.status_code == 201, resp.text
    return body["name"], openai.OpenAI(base_url=srv.base_url, api_key=resp.json()["secret"], max_retries=0, timeout=300)


def _queue_depth(srv) -> float:
    text = httpx.get(f"{srv.root_url}/metrics", timeout=30).text
    m = re.search(r"^gantry_queue_depth(?:\{[^}]*\})? (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def _wait_for(what: str, cond) -> None:
    deadline = time.monotonic() + 120
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


class Order:
    """A counter shared by every thread: the order in which things were seen."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = itertools.count()

    def next(self) -> int:
        with self._lock:
            return next(self._next)


def _first_token_at(srv, client: openai.OpenAI, order: Order, text: str) -> int:
    """Streams one short answer; returns the order number of its first token."""
    stream = client.chat.completions.create(
        model=srv.model_id, temperature=0, max_tokens=6, stream=True,
        messages=[{"role": "user", "content": text}])
    first = None
    for chunk in stream:
        if first is None and chunk.choices and (chunk.choices[0].delta.content or chunk.choices[0].finish_reason):
            first = order.next()
    assert first is not None, text
    return first


def test_a_flooding_key_delays_another_keys_request_by_one_round(srv):
    _, flooder = _key(srv, {"tenant": "flooder"})
    _, other = _key(srv, {"tenant": "other"})
    order = Order()
    with ThreadPoolExecutor(FLOOD + 1) as pool:
        flood = [pool.submit(_first_token_at, srv, flooder, order, f"Count from {i} to {i + 9}.") for i in range(FLOOD)]
        # Most of A's requests wait in the engine's queue before B sends its own.
        _wait_for("A's backlog", lambda: _queue_depth(srv) >= FLOOD // 2)
        b_sent = order.next()
        b_first = _first_token_at(srv, other, order, "Name three colours.")
        a_first = [f.result() for f in flood]
    between = [t for t in a_first if b_sent < t < b_first]
    after = [t for t in a_first if t > b_first]
    # Those already running when B came, and one more turn of A's: one round, not the backlog.
    assert len(between) <= PARALLEL + 1, f"{len(between)} of A's requests got their first token between B's request and B's first token"
    # A's backlog was there to jump: many of its requests started only after B's.
    assert len(after) >= FLOOD // 4, f"only {len(after)} of A's requests started after B's: the test proves nothing"


def test_cancelling_queued_requests_still_spends_the_keys_rpm(srv):
    name, key = _key(srv, {"rpm_limit": 3})
    long = dict(model=srv.model_id, temperature=0, max_tokens=400, stream=True,
                messages=[{"role": "user", "content": "Count from 1 to 1000, one number per line."}])
    # Two long streams hold both sequences.
    running = [key.chat.completions.create(**long) for _ in range(PARALLEL)]
    heads = [next(iter(s)) for s in running]
    assert all(heads)
    # A third waits for a sequence; its client gives up while it waits.
    queued = key.chat.completions.create(**long)
    _wait_for("the third request to queue", lambda: _queue_depth(srv) >= 1)
    queued.close()
    # It computed nothing but still counted: the fourth request this minute is over the limit.
    with pytest.raises(openai.RateLimitError) as raised:
        key.chat.completions.create(model=srv.model_id, max_tokens=1, messages=[{"role": "user", "content": "hi"}])
    err = error_body(raised.value.response)
    assert (err["type"], err["code"]) == ("requests", "rate_limit_exceeded"), err
    for s in running:
        s.close()


def _admin(srv, method: str, path: str, body=None, token: str | None = ADMIN_TOKEN):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.request(method, f"{srv.root_url}/admin/v1{path}", json=body, headers=headers, timeout=60)


def test_tenant_weights_are_set_shown_and_checked_by_the_admin_api(srv):
    t = f"weighed-{uuid.uuid4().hex[:6]}"
    r = _admin(srv, "PATCH", f"/tenants/{t}", {"weight": 4})
    assert r.status_code == 200, r.text
    assert r.json() == {"object": "tenant", "name": t, "weight": 4, "active_keys": 0}
    name, _ = _key(srv, {"tenant": t, "weight": 2})
    shown = _admin(srv, "GET", f"/keys/{name}").json()
    assert (shown["weight"], shown["tenant_weight"]) == (2, 4), shown
    listed = {x["name"]: x for x in _admin(srv, "GET", "/tenants").json()["data"]}
    assert listed[t]["active_keys"] == 1, listed
    for bad in ({"weight": 0}, {"weight": 1001}, {"weight": "3"}, {"weight": 2, "color": "red"}, {}):
        r = _admin(srv, "PATCH", f"/tenants/{t}", bad)
        assert r.status_code == 400, (bad, r.text)
        assert r.json()["error"]["type"] == "invalid_request_error", r.text
    r = _admin(srv, "POST", "/keys", {"name": f"w-{uuid.uuid4().hex[:6]}", "weight": 0})
    assert r.status_code == 400 and "weight" in r.json()["error"]["message"], r.text
    assert _admin(srv, "GET", "/tenants/no-such-tenant").status_code == 404
    assert _admin(srv, "PATCH", f"/tenants/{t}", {"weight": 9}, token=None).status_code == 401
    assert _admin(srv, "GET", f"/tenants/{t}").json()["weight"] == 4, "refused changes changed nothing"


def test_tenants_share_sequences_by_weight_however_many_keys_they_hold(srv):
    """Tenant H (weight 3, one key) and tenant L (weight 1, ten keys) flood two sequences with
    requests alike. Shared by key, L's ten keys would get 10 of every 11 starts; shared by
    tenant weight, H gets 3 of every 4."""
    suffix = uuid.uuid4().hex[:6]
    heavy, light = f"heavy-{suffix}", f"light-{suffix}"
    assert _admin(srv, "PATCH", f"/tenants/{heavy}", {"weight": 3}).status_code == 200
    _, h = _key(srv, {"tenant": heavy})
    lights = [_key(srv, {"tenant": light})[1] for _ in range(10)]
    order = Order()
    with ThreadPoolExecutor(60) as pool:
        hs = [pool.submit(_first_token_at, srv, h, order, f"Count from {i} to {i + 9}.") for i in range(30)]
        ls = [pool.submit(_first_token_at, srv, lights[i % 10], order, f"Count from {i} to {i + 9}.") for i in range(30)]
        h_first, l_first = [f.result() for f in hs], [f.result() for f in ls]
    # Past the first few (whoever's request came first), while both still have requests waiting.
    window = range(4, 28)
    h_in = sum(t in window for t in h_first)
    l_in = sum(t in window for t in l_first)
    assert h_in + l_in == len(window)
    assert 15 <= h_in <= 22, f"the weight-3 tenant started {h_in} of {len(window)}: {sorted(h_first)}"


def test_weights_set_by_the_cli_reach_the_server(srv):
    def gantry(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([gantry_bin(), *args, "--data-dir", srv.data_dir], capture_output=True, text=True, timeout=120)

    t = f"cli-{uuid.uuid4().hex[:6]}"
    done = gantry("tenants", "set", t, "--weight", "6")
    assert done.returncode == 0 and "weighs 6" in done.stdout, done.stderr
    made = gantry("keys", "create", "--name", f"{t}-key", "--tenant", t, "--weight", "5")
    assert made.returncode == 0, made.stderr
    shown = _admin(srv, "GET", f"/keys/{t}-key").json()
    assert (shown["weight"], shown["tenant_weight"]) == (5, 6), "the server reads what the CLI wrote"
    listed = json.loads(gantry("tenants", "list", "--format", "json").stdout)
    assert {"name": t, "weight": 6, "active_keys": 1} in listed, listed
    for bad in (["tenants", "set", t, "--weight", "0"], ["keys", "update", f"{t}-key", "--weight", "1001"]):
        refused = gantry(*bad)
        assert refused.returncode != 0 and "1..=1000" in refused.stderr, refused.stderr
    assert _admin(srv, "GET", f"/tenants/{t}").json()["weight"] == 6
