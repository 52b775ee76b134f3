"""Parallel requests and client disconnects."""

from __future__ import annotations

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from _util import gantry_bin, user

PROMPTS = [
    "What is 2 + 2?",
    "Name a fruit that is yellow.",
    "What color is the sky on a clear day?",
    "Say hello in French.",
    "What is the opposite of hot?",
    "Name one planet in the solar system.",
    "What is the capital of Japan?",
    "Write the word 'rust' backwards.",
]


def _ask(client, model_id, prompt):
    r = client.chat.completions.create(model=model_id, messages=user(prompt), temperature=0, max_tokens=16)
    c = r.choices[0]
    return c.message.content, c.finish_reason, r.usage.completion_tokens


def test_parallel_requests_match_solo_answers(client, server):
    solo = [_ask(client, server.model_id, p) for p in PROMPTS]
    assert all(content for content, _, _ in solo), solo
    with ThreadPoolExecutor(max_workers=len(PROMPTS)) as pool:
        parallel = list(pool.map(lambda p: _ask(client, server.model_id, p), PROMPTS))
    mismatches = [
        f"{p!r}: solo {s!r} vs parallel {q!r}" for p, s, q in zip(PROMPTS, solo, parallel) if s != q
    ]
    assert not mismatches, "\n".join(mismatches)


def _usage_totals(server):
    """(requests, completion_tokens) summed over `gantry usage --format json`."""
    out = subprocess.run(
        [gantry_bin(), "usage", "--data-dir", server.data_dir, "--format", "json"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    return sum(r["requests"] for r in rows), sum(r["completion_tokens"] for r in rows)


def _settled_usage(server):
    prev = _usage_totals(server)
    for _ in range(20):
        time.sleep(0.3)
        cur = _usage_totals(server)
        if cur == prev:
            return cur
        prev = cur
    return prev


def _read_three_chunks_and_close(client, server):
    stream = client.chat.completions.create(
        model=server.model_id, messages=user("Write a long story about a lighthouse keeper."),
        max_tokens=200, temperature=0, stream=True,
    )
    got = []
    for chunk in stream:
        got.append(chunk)
        if len(got) == 3:
            break
    stream.close()
    assert len(got) == 3, "the stream ended before three chunks"
    return got


def test_client_disconnect_leaves_server_healthy(client, server, http):
    _read_three_chunks_and_close(client, server)
    r = client.chat.completions.create(model=server.model_id, messages=user("Say hi."), max_tokens=4, temperature=0)
    assert r.choices[0].message.content
    assert r.usage.completion_tokens >= 1
    assert http.get("/health").status_code == 200


def test_client_disconnect_cancels_generation_and_is_metered(client, server):
    requests0, completion0 = _settled_usage(server)
    started = time.monotonic()
    _read_three_chunks_and_close(client, server)
    # The abandoned request must still write its usage record, and well before 200 tokens.
    deadline = time.monotonic() + 60
    while True:
        requests1, completion1 = _usage_totals(server)
        if requests1 > requests0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert requests1 == requests0 + 1, f"usage records: {requests0} before, {requests1} after the disconnect"
    generated = completion1 - completion0
    assert 2 <= generated < 200, (
        f"the disconnected stream was metered at {generated} completion tokens "
        f"({time.monotonic() - started:.1f}s after it started); expected it to be cancelled early"
    )
