"""A long prompt is not starved by another key's stream of short ones (issue #52), against the
real binary.

Key A keeps a stream running and three loops of fresh ~200-token prompts (`max_tokens: 1`); key B
sends one ~3,800-token prompt. Prompt rows are shared in deficit round-robin between keys, so B's
prompt reads its share of every step and finishes within a few times its time alone. It used to
get only what A's prompts left, which was nothing while one of them was ready at every step: B
had not finished after 125 s where it took 27-35 s alone."""

from __future__ import annotations

import threading
import time
import uuid

import openai

from conftest import serving
from _util import httpx

ADMIN_TOKEN = "prompt-sharing-e2e-admin-token-0123456789"
# Small and fast, so that the flood and the long prompt take seconds, not minutes.
MODEL = "smollm2-135m"


def _key(srv) -> openai.OpenAI:
    body = {"name": f"share-{uuid.uuid4().hex[:8]}", "tenant": f"t-{uuid.uuid4().hex[:6]}"}
    resp = httpx.post(f"{srv.root_url}/admin/v1/keys", json=body,
                      headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60)
    assert resp.status_code == 201, resp.text
    return openai.OpenAI(base_url=srv.base_url, api_key=resp.json()["secret"], max_retries=0, timeout=600)


def _long_prompt() -> str:
    """About 3,800 tokens, fresh from its first word (no cached prefix helps it)."""
    lines = [f"line {i}: item {i * 7 % 101} is {i * 13 % 997}." for i in range(190)]
    return uuid.uuid4().hex + "\n" + "\n".join(lines) + "\nWhich item had the largest value?"


def _short_prompt() -> str:
    nonce = uuid.uuid4().hex
    return f"{nonce} " + " ".join(f"word{i * 31 % 211}" for i in range(60)) + " Summarise."


def _read_long(srv, client: openai.OpenAI) -> tuple[float, int]:
    started = time.monotonic()
    resp = client.chat.completions.create(model=srv.model_id, max_tokens=1, temperature=0,
                                          messages=[{"role": "user", "content": _long_prompt()}])
    return time.monotonic() - started, resp.usage.prompt_tokens


def test_a_long_prompt_finishes_beside_another_keys_flood_of_short_ones():
    settings = ("--ctx-size", "4608", "--parallel", "5")
    with serving(MODEL, ("--admin-token", ADMIN_TOKEN), settings) as (srv, _):
        a, b = _key(srv), _key(srv)
        # Warm-up: the first request pays for lazy start-up work.
        b.chat.completions.create(model=srv.model_id, max_tokens=1, messages=[{"role": "user", "content": "hi"}])
        solo, prompt_tokens = _read_long(srv, b)
        assert 3000 <= prompt_tokens <= 4600, prompt_tokens

        stop = threading.Event()
        answered = [0]
        errors: list[BaseException] = []

        def stream() -> None:
            while not stop.is_set():
                s = a.chat.completions.create(model=srv.model_id, max_tokens=1500, stream=True,
                                              messages=[{"role": "user", "content": "Count to ten thousand."}])
                for _ in s:
                    if stop.is_set():
                        break
                s.close()

        def shorts() -> None:
            try:
                while not stop.is_set():
                    a.chat.completions.create(model=srv.model_id, max_tokens=1,
                                              messages=[{"role": "user", "content": _short_prompt()}])
                    answered[0] += 1
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=stream, daemon=True)] + [threading.Thread(target=shorts, daemon=True) for _ in range(3)]
        for t in threads:
            t.start()
        try:
            deadline = time.monotonic() + 60
            while answered[0] < 6:
                assert time.monotonic() < deadline and not errors, f"the flood did not start: {errors}"
                time.sleep(0.05)
            flooded_before = answered[0]
            # Its client waits as long as the bound allows, then gives up: a starved prompt fails.
            bound = 4 * solo + 20
            b_slow = openai.OpenAI(base_url=srv.base_url, api_key=b.api_key, max_retries=0, timeout=bound)
            try:
                took, _ = _read_long(srv, b_slow)
            except openai.APITimeoutError:
                took = float("inf")
            flooded = answered[0] - flooded_before
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=120)
        assert not errors, errors
        # The flood ran the whole time B's prompt was read: A's short prompts kept being answered.
        assert flooded >= 3, f"only {flooded} short prompts answered meanwhile: the test proves nothing"
        assert took <= bound, f"B's {prompt_tokens}-token prompt took {took:.1f} s beside the flood, {solo:.1f} s alone"
