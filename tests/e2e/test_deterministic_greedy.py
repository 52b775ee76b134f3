"""`--deterministic-greedy` on the real model: one temperature-0 request returns the same text and
the same logprobs alone, after its prompt filled the cache, beside 7 other streams, and beside a
stream that drafts (`--speculate always`). Without the flag the same checks fail on this model:
the same prompt came back with different logprobs from the prefix cache and beside 7 streams
(see docs/determinism.md)."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from _util import httpx, user
from conftest import _models, serving

PROMPT = "Name three fruits and say one thing about each."
OTHERS = [
    "Count from one to twenty in words.",
    "Write a short poem about autumn leaves.",
    "List five prime numbers and say why each is prime.",
    "Describe a cat in three sentences.",
    "What is the capital of France? Answer at length.",
    "Write a limerick about a programmer.",
    "Explain recursion to a child.",
]
# Sent back almost verbatim: `always` drafts most of it from the prompt.
CODE = "\n".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(12))
CODE_EDIT = "Repeat this file exactly, nothing else:\n\n```python\n" + CODE + "```"


@pytest.fixture(scope="module")
def srv():
    with serving(_models()[0], ("--deterministic-greedy", "--speculate", "always")) as (server, _client):
        yield server


def _ask(server, prompt, max_tokens=48, **extra):
    body = {
        "model": server.model_id,
        "messages": user(prompt),
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
        **extra,
    }
    r = httpx.post(
        f"{server.base_url}/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {server.api_key}"},
        timeout=900,
    )
    assert r.status_code == 200, r.text
    data = r.json()
    choice = data["choices"][0]
    logprobs = [
        (t["token"], t["logprob"], [(a["token"], a["logprob"]) for a in t["top_logprobs"]])
        for t in choice["logprobs"]["content"]
    ]
    cached = (data["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return choice["message"]["content"], logprobs, cached


def _drafted(server) -> float:
    text = httpx.get(f"{server.root_url}/metrics", timeout=30).text
    m = re.search(r"^gantry_draft_tokens_total(?:\{[^}]*\})? (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def _beside(server, others):
    """The request under test and `others` ((prompt, max_tokens, sampling) each) all at once."""
    with ThreadPoolExecutor(max_workers=1 + len(others)) as pool:
        mine = pool.submit(_ask, server, PROMPT)
        rest = [pool.submit(_ask, server, p, n, **sampling) for p, n, sampling in others]
        [f.result() for f in rest]
        return mine.result()


def test_same_text_and_logprobs_whatever_ran_before_and_beside(srv):
    text, logprobs, _ = _ask(srv, PROMPT)
    assert text and len(logprobs) > 10
    want = (text, logprobs)

    # The same prompt again: it would be served from the prefix cache; here it is recomputed.
    again = _ask(srv, PROMPT)
    assert again[2] == 0, "a deterministic greedy request reuses no cached prefix"
    assert again[:2] == want, "after a cache fill"

    # Beside 7 other streams, greedy and sampled, all started at once.
    sampled = {"temperature": 0.8, "seed": 3}
    others = [(p, 48, sampled if i % 2 else {}) for i, p in enumerate(OTHERS)]
    assert _beside(srv, others)[:2] == want, "beside 7 streams"

    # Beside a stream that drafts (sampled without a seed: greedy and seeded ones do not draft
    # under the flag), its drafts verified in the same steps. The greedy request never drafts.
    before = _drafted(srv)
    assert _beside(srv, [(CODE_EDIT, 160, {"temperature": 0.2})])[:2] == want, "beside drafts"
    assert _drafted(srv) > before, "the code edit was drafted"
