"""The prefix cache beyond the slots (`--cache-ram`): on a one-slot server every new document
pushes the previous one out of the KV cache, and asking about a document again still finds its
tokens, copied back from host memory, with the same answer as when they were computed."""

from __future__ import annotations

import re

import pytest

from _util import httpx
from conftest import _models, serving

DOCS = {
    "lighthouse": (
        "The Tower of Hercules in A Coruna is the oldest lighthouse still in use. The Romans built it "
        "in the second century, and it was restored in 1791. It stands 55 metres tall on a hill "
        "above the Atlantic and has been a UNESCO World Heritage Site since 2009. "
    )
    * 3,
    "canal": (
        "The Canal du Midi links the Garonne to the Mediterranean across southern France. Pierre-Paul "
        "Riquet designed it, and it opened in 1681 after fourteen years of work by twelve thousand "
        "labourers. Plane trees planted along its banks shade the towpaths. "
    )
    * 3,
}


@pytest.fixture(scope="module")
def one_slot():
    with serving(_models()[0], ("--parallel", "1")) as (srv, c):
        yield srv, c


def _ask(client, model, doc, question):
    return client.chat.completions.create(
        model=model,
        temperature=0,
        max_tokens=16,
        messages=[
            {"role": "system", "content": "Answer from the document in one short sentence.\n\n" + DOCS[doc]},
            {"role": "user", "content": question},
        ],
    )


def _gauge(srv, name: str) -> float:
    text = httpx.get(f"{srv.root_url}/metrics", timeout=30).text
    m = re.search(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)  # labelled by model
    assert m, f"{name} is exported"
    return float(m.group(1))


def test_a_document_pushed_out_of_the_only_slot_comes_back_from_host_memory(one_slot):
    srv, client = one_slot
    first = _ask(client, srv.model_id, "lighthouse", "How tall is it?")
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    other = _ask(client, srv.model_id, "canal", "Who designed it?")
    # The canal took the only slot; the lighthouse went to host memory first.
    assert other.usage.prompt_tokens_details.cached_tokens < 40, other.usage
    assert _gauge(srv, "gantry_host_cache_entries") >= 1
    assert _gauge(srv, "gantry_host_cache_bytes") > 1_000_000, "~12 KB per token of the 0.5B"

    again = _ask(client, srv.model_id, "lighthouse", "How tall is it?")
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1, again.usage
    assert again.choices[0].message.content == first.choices[0].message.content

    # A new question about the same document reuses the document.
    follow = _ask(client, srv.model_id, "canal", "When did it open?")
    cached = follow.usage.prompt_tokens_details.cached_tokens
    assert follow.usage.prompt_tokens - 20 < cached < follow.usage.prompt_tokens, follow.usage
