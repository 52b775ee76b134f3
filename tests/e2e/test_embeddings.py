"""`POST /v1/embeddings` on the real all-MiniLM-L6-v2 beside the chat model, one server, one key:
the openai SDK's `embeddings.create` (its default base64 and plain floats), the same vectors as
`gantry models embed` (which test_embedding_reference.py checks against numpy), concurrent
requests batched together without changing a vector, LangChain's `OpenAIEmbeddings` in a small
retrieval loop, each route refusing the other kind of model, and the ledger booking exactly the
tokens each client was told. Skipped, and said so, where the model is not pulled (`make test`
pulls it)."""

from __future__ import annotations

import json
import math
import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

from _util import gantry_bin
from conftest import _cache_dir, _models, serving

EMBEDDER = "minilm"
GGUF = "all-MiniLM-L6-v2-f32.gguf"
DOCS = [
    "The Eiffel Tower is a wrought-iron lattice tower in Paris, France.",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen.",
    "The stock market fell sharply after the central bank raised interest rates.",
    "A golden retriever is a friendly, medium-large dog bred to retrieve game.",
    "Python lists are mutable sequences; tuples are immutable.",
]
QUERIES = {
    "Which landmark stands in the French capital?": 0,
    "How do plants make food from sunlight?": 1,
    "Why did share prices drop?": 2,
    "What breed of dog fetches birds for hunters?": 3,
    "Can I change a tuple after creating it in Python?": 4,
}


@pytest.fixture(scope="module")
def both():
    if not (_cache_dir() / "models" / GGUF).is_file():
        pytest.skip("all-minilm-l6-v2 is not pulled: run `gantry models pull all-minilm-l6-v2`")
    with serving(_models()[0], ("--model", f"{EMBEDDER}=all-minilm-l6-v2")) as (srv, c):
        yield srv, c


def _cosine(a, b) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def _ledger(srv) -> list[dict]:
    out = subprocess.run(
        [gantry_bin(), "usage", "--requests", "--data-dir", srv.data_dir, "--format", "json"],
        check=True, capture_output=True, text=True, timeout=60,
    )
    return json.loads(out.stdout)


def test_the_sdk_gets_unit_vectors_in_both_encodings_equal_to_the_engines(both):
    srv, client = both
    listed = {m.id: m.model_extra.get("capabilities") for m in client.models.list().data}
    assert listed[EMBEDDER] == ["embeddings"], listed
    assert "chat" in listed[srv.model_id] and "embeddings" not in listed[srv.model_id], listed

    # The SDK asks for base64 unless told otherwise, and decodes it.
    b64 = client.embeddings.create(model=EMBEDDER, input=DOCS)
    floats = client.embeddings.create(model=EMBEDDER, input=DOCS, encoding_format="float")
    assert [d.index for d in b64.data] == list(range(len(DOCS)))
    for a, b in zip(b64.data, floats.data):
        assert len(a.embedding) == 384
        assert a.embedding == pytest.approx(b.embedding, abs=1e-6)
        assert math.sqrt(sum(x * x for x in a.embedding)) == pytest.approx(1.0, abs=1e-4)
    assert b64.usage.prompt_tokens == floats.usage.prompt_tokens == b64.usage.total_tokens > len(DOCS)
    assert b64.model == EMBEDDER

    engine = subprocess.run(
        [gantry_bin(), "models", "embed", "all-minilm-l6-v2", "--threads", "2", *DOCS],
        check=True, capture_output=True, text=True, timeout=300,
    )
    reference = json.loads(engine.stdout)
    assert sum(len(t) for t in reference["tokens"]) == floats.usage.prompt_tokens
    for got, want in zip(floats.data, reference["embeddings"]):
        assert _cosine(got.embedding, want) >= 0.9999

    # Token ids are embedded as given: the ids the engine tokenized give the same vector.
    by_ids = client.embeddings.create(model=EMBEDDER, input=reference["tokens"][:2], encoding_format="float")
    assert _cosine(by_ids.data[1].embedding, floats.data[1].embedding) >= 0.9999


def test_concurrent_requests_share_decodes_without_changing_a_vector(both):
    _, client = both
    alone = [client.embeddings.create(model=EMBEDDER, input=[d], encoding_format="float").data[0].embedding for d in DOCS]

    def one(i: int):
        texts = [DOCS[(i + j) % len(DOCS)] for j in range(32)]
        r = client.embeddings.create(model=EMBEDDER, input=texts, encoding_format="float")
        return [(texts[d.index], d.embedding) for d in r.data]

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(16)))
    assert len(results) == 16
    for result in results:
        assert len(result) == 32
        for text, vector in result:
            assert _cosine(vector, alone[DOCS.index(text)]) >= 0.9999


def test_langchain_retrieval_finds_each_answer(both):
    srv, _ = both
    from langchain_core.vectorstores import InMemoryVectorStore
    from langchain_openai import OpenAIEmbeddings

    # LangChain tokenizes with OpenAI's tiktoken unless told not to: another model's token ids
    # would mean nothing here (docs/api.md says so).
    embeddings = OpenAIEmbeddings(
        model=EMBEDDER, base_url=srv.base_url, api_key=srv.api_key, check_embedding_ctx_length=False
    )
    store = InMemoryVectorStore.from_texts(DOCS, embedding=embeddings)
    for query, want in QUERIES.items():
        hit = store.similarity_search(query, k=1)[0]
        assert hit.page_content == DOCS[want], query


def test_routes_refuse_the_other_kind_of_model_and_the_ledger_books_what_was_told(both):
    srv, client = both
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=srv.model_id, input="hello")
    assert e.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=EMBEDDER, messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=EMBEDDER, input="word " * 600)
    assert e.value.body["param"] == "input" and e.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=EMBEDDER, input="x", dimensions=64)
    assert e.value.body["param"] == "dimensions"

    told = {}
    for n in (1, 3, 5):
        rid = f"emb-{uuid.uuid4()}"
        r = client.embeddings.create(model=EMBEDDER, input=DOCS[:n], extra_headers={"x-request-id": rid})
        told[rid] = r.usage.prompt_tokens
    chat_rid = f"chat-{uuid.uuid4()}"
    chat = client.chat.completions.create(
        model=srv.model_id, max_tokens=8, messages=[{"role": "user", "content": "Say hi."}],
        extra_headers={"x-request-id": chat_rid},
    )
    rows = {r["client_request_id"]: r for r in _ledger(srv)}
    for rid, tokens in told.items():
        assert rows[rid]["prompt_tokens"] == tokens and rows[rid]["completion_tokens"] == 0, rows[rid]
        assert rows[rid]["model"] == EMBEDDER
    assert rows[chat_rid]["prompt_tokens"] == chat.usage.prompt_tokens
    assert rows[chat_rid]["completion_tokens"] == chat.usage.completion_tokens
