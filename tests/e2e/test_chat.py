"""Chat Completions through the official openai SDK: shapes, limits, determinism, streaming,
stop strings, seeds, n, logprobs, and the models endpoints."""

from __future__ import annotations

import json
import time

import openai
import pytest

from _util import collect_stream, httpx, sse_payloads, user

GREEDY_PROMPT = "What is the capital of France? Answer in one sentence."
LONG_PROMPT = "Write a long, detailed essay about the history of the Roman Empire."
COUNT_PROMPT = "Count from 1 to 10, separated by commas. Reply with the numbers only."


# ---------------------------------------------------------------------------------------------
# Non-streaming basics
# ---------------------------------------------------------------------------------------------


def test_non_streaming_response_shape(client, server):
    before = int(time.time())
    r = client.chat.completions.create(
        model=server.model_id, messages=user("Name three primary colors."), max_tokens=16, temperature=0
    )
    assert r.id.startswith("chatcmpl-"), r.id
    assert r.object == "chat.completion"
    assert r.model == server.model_id
    assert abs(r.created - before) < 600, (r.created, before)
    assert len(r.choices) == 1
    choice = r.choices[0]
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content.strip(), repr(choice.message.content)
    assert choice.finish_reason in {"stop", "length"}
    assert choice.logprobs is None, "logprobs were not requested"
    u = r.usage
    assert u is not None
    assert u.prompt_tokens > 0
    assert 1 <= u.completion_tokens <= 16
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    if choice.finish_reason == "length":
        assert u.completion_tokens == 16


@pytest.mark.parametrize("param", ["max_tokens", "max_completion_tokens"])
def test_token_limit_finishes_with_length(client, server, param):
    r = client.chat.completions.create(
        model=server.model_id, messages=user(LONG_PROMPT), temperature=0, **{param: 5}
    )
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + 5
    assert r.choices[0].message.content, "5 tokens of an essay should not be empty"


# ---------------------------------------------------------------------------------------------
# Greedy determinism, and streaming checked against the same greedy request
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def greedy(client, server):
    """The same temperature-0 request: twice non-streamed, once streamed with usage."""
    kw = dict(model=server.model_id, messages=user(GREEDY_PROMPT), temperature=0, max_tokens=24)
    first = client.chat.completions.create(**kw)
    second = client.chat.completions.create(**kw)
    streamed = collect_stream(
        client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    )
    return first, second, streamed


def test_temperature_zero_is_deterministic(greedy):
    first, second, _ = greedy
    assert first.choices[0].message.content == second.choices[0].message.content
    assert first.choices[0].finish_reason == second.choices[0].finish_reason
    assert first.usage.completion_tokens == second.usage.completion_tokens
    assert first.id != second.id, "every completion needs its own id"


def test_streamed_greedy_matches_non_streamed(greedy):
    first, _, streamed = greedy
    assert streamed.content(0) == first.choices[0].message.content
    assert streamed.finish_reasons.get(0) == [first.choices[0].finish_reason]


def test_streamed_usage_equals_non_streamed_usage(greedy):
    first, _, streamed = greedy
    u = streamed.usage
    assert u is not None, "include_usage: the last chunk must carry usage"
    assert (u.prompt_tokens, u.completion_tokens, u.total_tokens) == (
        first.usage.prompt_tokens,
        first.usage.completion_tokens,
        first.usage.total_tokens,
    )


def test_stream_chunk_shape_with_include_usage(greedy, server):
    _, _, s = greedy
    chunks = s.chunks
    assert len(chunks) >= 3, f"expected role, content, finish and usage chunks, got {len(chunks)}"
    first = chunks[0]
    assert first.choices and first.choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1, {c.id for c in chunks}
    assert chunks[0].id.startswith("chatcmpl-")
    for c in chunks:
        assert c.object == "chat.completion.chunk"
        assert c.model == server.model_id
    finishing = [c for c in chunks for ch in c.choices if ch.finish_reason is not None]
    assert len(finishing) == 1, f"{len(finishing)} chunks carry a finish_reason"
    last = chunks[-1]
    assert last.choices == [], last
    assert last.usage is not None
    for c in chunks[:-1]:
        assert c.usage is None, f"usage before the last chunk: {c}"
    # No content after the finish chunk.
    fin_at = next(i for i, c in enumerate(chunks) if any(ch.finish_reason for ch in c.choices))
    for c in chunks[fin_at + 1 :]:
        assert all(not ch.delta.content for ch in c.choices), c


def test_stream_without_include_usage_has_no_usage(client, server):
    s = collect_stream(
        client.chat.completions.create(
            model=server.model_id, messages=user("Say hello."), temperature=0, max_tokens=4, stream=True
        )
    )
    assert s.chunks, "no chunks"
    assert all(c.usage is None for c in s.chunks)
    assert all(c.choices for c in s.chunks), "a choices-less chunk is only sent for include_usage"
    assert s.chunks[0].choices[0].delta.role == "assistant"
    assert len(s.finish_reasons.get(0, [])) == 1


def test_raw_sse_framing(http, auth, server):
    body = {
        "model": server.model_id,
        "messages": user("Say hello."),
        "max_tokens": 4,
        "temperature": 0,
        "stream": True,
    }
    with http.stream("POST", "/v1/chat/completions", json=body, headers=auth) as resp:
        assert resp.status_code == 200
        assert resp.headers.get("content-type", "").startswith("text/event-stream"), resp.headers
        assert resp.headers.get("x-request-id")
        raw = b"".join(resp.iter_bytes()).decode("utf-8")
    assert raw.endswith("data: [DONE]\n\n"), repr(raw[-200:])
    payloads = sse_payloads(raw)
    assert payloads[-1] == "[DONE]"
    assert payloads.count("[DONE]") == 1
    parsed = [json.loads(p) for p in payloads[:-1]]
    assert parsed and all(p["object"] == "chat.completion.chunk" for p in parsed)
    assert parsed[0]["choices"][0]["delta"]["role"] == "assistant"


# ---------------------------------------------------------------------------------------------
# Stop strings
# ---------------------------------------------------------------------------------------------


def _pick_stop(text: str) -> str:
    """A substring from the middle of the greedy output (not at its start)."""
    for cand in (", 4", ", 5", ", 6", ",4", " 4", "4"):
        if text.find(cand) > 0:
            return cand
    mid = len(text) // 2
    for start in range(mid, len(text) - 2):
        cand = text[start : start + 3]
        if cand.strip() and text.find(cand) > 0:
            return cand
    raise AssertionError(f"greedy counting output too short to pick a stop string from: {text!r}")


@pytest.fixture(scope="module")
def counting(client, server):
    r = client.chat.completions.create(
        model=server.model_id, messages=user(COUNT_PROMPT), temperature=0, max_tokens=30
    )
    text = r.choices[0].message.content
    assert len(text) >= 6, f"greedy counting output: {text!r}"
    stop = _pick_stop(text)
    return text, stop, text[: text.index(stop)]


def test_stop_cuts_non_streamed_output(client, server, counting):
    text, stop, expected = counting
    r = client.chat.completions.create(
        model=server.model_id, messages=user(COUNT_PROMPT), temperature=0, max_tokens=30,
        stop=["@@never@@", stop],
    )
    content = r.choices[0].message.content
    assert content == expected, f"greedy output {text!r}, stop {stop!r}"
    assert stop not in content
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens < 30


def test_stop_cuts_streamed_output(client, server, counting):
    text, stop, expected = counting
    s = collect_stream(
        client.chat.completions.create(
            model=server.model_id, messages=user(COUNT_PROMPT), temperature=0, max_tokens=30,
            stop=stop, stream=True,
        )
    )
    assert s.content(0) == expected, f"greedy output {text!r}, stop {stop!r}, deltas {s.deltas.get(0)}"
    for d in s.deltas.get(0, []):
        assert stop not in d, f"stop string {stop!r} in delta {d!r}"
    assert s.finish_reasons.get(0) == ["stop"]


# ---------------------------------------------------------------------------------------------
# Seeds, n, logprobs
# ---------------------------------------------------------------------------------------------

SEED_PROMPT = "Write a short poem about the sea."


def test_same_seed_same_output(client, server):
    kw = dict(model=server.model_id, messages=user(SEED_PROMPT), temperature=1.0, max_tokens=16)
    a = client.chat.completions.create(**kw, seed=1234).choices[0].message.content
    b = client.chat.completions.create(**kw, seed=1234).choices[0].message.content
    assert a and a == b, (a, b)
    s = collect_stream(client.chat.completions.create(**kw, seed=1234, stream=True))
    assert s.content(0) == a, "the same seed streamed should sample the same tokens"
    other = client.chat.completions.create(**kw, seed=98765).choices[0].message.content
    assert isinstance(other, str) and other  # usually differs from `a`; not asserted


def test_n_two_choices(client, server):
    msgs = user(LONG_PROMPT)
    r = client.chat.completions.create(
        model=server.model_id, messages=msgs, n=2, max_tokens=6, temperature=1.0, seed=7
    )
    assert [c.index for c in r.choices] == [0, 1]
    for c in r.choices:
        assert c.message.role == "assistant"
        assert isinstance(c.message.content, str) and c.message.content
        assert c.finish_reason == "length", c
    assert r.usage.completion_tokens == 12
    one = client.chat.completions.create(model=server.model_id, messages=msgs, max_tokens=1, temperature=0)
    assert r.usage.prompt_tokens == one.usage.prompt_tokens, "the prompt is counted once, not per choice"
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12


def test_n_two_choices_streamed(client, server):
    s = collect_stream(
        client.chat.completions.create(
            model=server.model_id, messages=user(LONG_PROMPT), n=2, max_tokens=4, temperature=1.0, seed=7,
            stream=True, stream_options={"include_usage": True},
        )
    )
    roles = {ch.index for c in s.chunks for ch in c.choices if ch.delta.role == "assistant"}
    assert roles == {0, 1}
    assert len({c.id for c in s.chunks}) == 1
    assert set(s.finish_reasons) == {0, 1}
    for i in (0, 1):
        assert s.finish_reasons[i] == ["length"], s.finish_reasons
        assert s.content(i), f"choice {i} streamed no content"
    assert s.usage is not None and s.usage.completion_tokens == 8


def test_logprobs(client, server):
    r = client.chat.completions.create(
        model=server.model_id, messages=user("Describe the ocean in detail."), temperature=0, max_tokens=8,
        logprobs=True, top_logprobs=3,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "length"
    assert choice.logprobs is not None and choice.logprobs.content is not None
    entries = choice.logprobs.content
    assert len(entries) == r.usage.completion_tokens == 8
    for e in entries:
        assert e.logprob <= 0.0, e
        assert len(e.top_logprobs) == 3, e
        tops = [t.logprob for t in e.top_logprobs]
        assert tops == sorted(tops, reverse=True), tops
        assert all(t <= 0.0 for t in tops)
        # Greedy: the chosen token is the most likely one.
        assert e.token == e.top_logprobs[0].token, e
        assert abs(e.logprob - e.top_logprobs[0].logprob) < 1e-3, e
    assert "".join(e.token for e in entries) == choice.message.content
    assert all(e.bytes is not None for e in entries), "every logprob entry carries its bytes"
    raw = bytes(b for e in entries for b in e.bytes)
    assert raw == choice.message.content.encode("utf-8")


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


def test_models_list_and_retrieve(client, server):
    ids = [m.id for m in client.models.list()]
    assert server.model_id in ids, ids
    m = client.models.retrieve(server.model_id)
    assert m.id == server.model_id
    assert m.object == "model"


def test_models_retrieve_unknown(client):
    with pytest.raises(openai.NotFoundError) as ei:
        client.models.retrieve("nope")
    assert ei.value.status_code == 404
    assert ei.value.code == "model_not_found"


def test_prefix_cache_reports_cached_tokens(client, server):
    system = "You are Gantry's test assistant. Answer in one short sentence. " * 8
    kw = dict(model=server.model_id, temperature=0, max_tokens=12)
    first = client.chat.completions.create(
        **kw, messages=[{"role": "system", "content": system}, {"role": "user", "content": "Name a colour."}]
    )
    again = client.chat.completions.create(
        **kw, messages=[{"role": "system", "content": system}, {"role": "user", "content": "Name a colour."}]
    )
    other = client.chat.completions.create(
        **kw, messages=[{"role": "system", "content": system}, {"role": "user", "content": "Name a fruit."}]
    )
    assert again.choices[0].message.content == first.choices[0].message.content
    assert again.usage.prompt_tokens == first.usage.prompt_tokens
    # Everything but the last prompt token comes from the cache on an exact repeat.
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    # A new question after the same system prompt reuses at least the system prompt.
    assert other.usage.prompt_tokens_details.cached_tokens >= 100
    assert other.usage.prompt_tokens_details.cached_tokens < other.usage.prompt_tokens
