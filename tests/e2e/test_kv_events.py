"""KV-cache events for llm-d's precise prefix routing (issue #57): the real server publishes its
blocks on a ZMQ PUB socket (`--kv-events-endpoint`) in vLLM's msgpack format, and a subscriber
that indexes them as llm-d's indexer does predicts, from the events alone, the `cached_tokens`
of a follow-up request in the same cache scope, and 0 for another tenant's.

The index recomputes its own keys from each block's tokens, its parent's key and its
`extra_keys`, as the indexer does; a scoped (tenant) block carries its scope there, so only a
request hashed with that scope matches it. Gantry reuses a prompt's prefix token by token and
announces whole 64-token blocks only, so the prediction `p` (whole blocks matched, in tokens)
and the real count `c` satisfy `p <= c < p + 64`."""

from __future__ import annotations

import hashlib
import socket
import time
import uuid

import msgpack
import openai
import pytest
import zmq

from _util import httpx
from conftest import _models, serving

ADMIN_TOKEN = "kv-events-e2e-admin-token-0123456789"
POD = "pod-under-test"
BLOCK = 64


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _document(sentences: int) -> str:
    words = ["river", "harbour", "granite", "lantern", "orchard", "meadow", "signal", "copper", "ledger", "voyage"]
    return " ".join(
        f"Note {i}: the {words[i % 10]} near the {words[(i * 3) % 10]} kept its {words[(i * 7) % 10]}."
        for i in range(sentences))


def _scope_tag(tenant: str) -> str:
    """The `extra_keys` tag of a tenant-scoped key's blocks: its scope id, the first 8 bytes
    (little-endian) of SHA-256("tenant" 0 name), as a scope-aware router would compute it."""
    digest = hashlib.sha256(b"tenant\0" + tenant.encode()).digest()
    return f"gantry-cache-scope:{max(int.from_bytes(digest[:8], 'little'), 1):016x}"


class Index:
    """The blocks of one pod and model, keyed as llm-d keys them: by the parent's key, the
    block's tokens and its extra keys, never by the engine's opaque hashes."""

    def __init__(self, sub: zmq.Socket, topic: str):
        self.sub, self.topic = sub, topic
        self.by_engine_hash: dict[int, tuple] = {}
        self.media: dict[tuple, set[str]] = {}  # each key's media: "GPU" (KV cache), "CPU" (host)
        self.stored_events: list[list] = []
        self.last_sequence = -1

    def pump(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if not self.sub.poll(int(left * 1000) + 1):
                break
            topic, seq, payload = self.sub.recv_multipart()
            assert topic.decode() == self.topic
            sequence = int.from_bytes(seq, "big")
            assert sequence > self.last_sequence, "sequence numbers grow"
            self.last_sequence = sequence
            ts, events, rank = msgpack.unpackb(payload)
            # Stamped when published: read later, never from the future (nor a day old).
            assert time.time() - 86_400 < ts < time.time() + 5 and rank == 0
            for event in events:
                self._apply(event)

    def _apply(self, event: list) -> None:
        if event[0] == "BlockStored":
            hashes, parent, tokens, block_size, _lora_id, medium, _lora_name, extra_keys = event[1:9]
            assert block_size == BLOCK and medium in ("GPU", "CPU") and len(tokens) == BLOCK * len(hashes)
            self.stored_events.append(event)
            key = self.by_engine_hash[parent] if parent is not None else ()
            for i, engine_hash in enumerate(hashes):
                extra = tuple(extra_keys[i]) if extra_keys else None
                key = (key, tuple(tokens[i * BLOCK:(i + 1) * BLOCK]), extra)
                self.by_engine_hash[engine_hash] = key
                self.media.setdefault(key, set()).add(medium)
        elif event[0] == "BlockRemoved":
            for engine_hash in event[1]:
                held = self.media.get(self.by_engine_hash[engine_hash], set())
                assert event[2] in held, "only a stored block is removed"
                held.discard(event[2])
        else:
            assert event == ["AllBlocksCleared"]
            self.by_engine_hash.clear()
            self.media.clear()

    def predict(self, tokens: list[int], scope_tag: str | None) -> int:
        """Tokens of `tokens` a request with `scope_tag` finds cached here: whole blocks."""
        key, matched = (), 0
        for start in range(0, len(tokens) - BLOCK + 1, BLOCK):
            key = (key, tuple(tokens[start:start + BLOCK]), (scope_tag,) if scope_tag else None)
            if not self.media.get(key):
                break
            matched += BLOCK
        return matched


@pytest.fixture(scope="module")
def setup():
    port = _free_port()
    extra = ("--admin-token", ADMIN_TOKEN, "--kv-events-endpoint", f"tcp://127.0.0.1:{port}", "--kv-events-pod", POD)
    with serving(_models()[0], extra) as (server, _client):
        sub = zmq.Context.instance().socket(zmq.SUB)
        topic = f"kv@{POD}@{server.model_id}"
        sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        sub.connect(f"tcp://127.0.0.1:{port}")
        time.sleep(1.0)  # the subscription reaches the publisher before any event is sent
        try:
            yield server, Index(sub, topic)
        finally:
            sub.close(linger=0)


def _key(srv, tenant: str, cache_scope: str | None = None) -> openai.OpenAI:
    body = {"name": f"{tenant}-{uuid.uuid4().hex[:8]}", "tenant": tenant}
    if cache_scope:
        body["cache_scope"] = cache_scope
    resp = httpx.post(f"{srv.root_url}/admin/v1/keys", json=body,
                      headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60)
    assert resp.status_code == 201, resp.text
    return openai.OpenAI(base_url=srv.base_url, api_key=resp.json()["secret"], max_retries=0, timeout=300)


def _messages(document: str, question: str) -> list[dict]:
    return [{"role": "system", "content": document}, {"role": "user", "content": question}]


def _tokens(srv, client: openai.OpenAI, messages: list[dict]) -> list[int]:
    resp = httpx.post(f"{srv.root_url}/tokenize", json={"model": srv.model_id, "messages": messages},
                      headers={"Authorization": f"Bearer {client.api_key}"}, timeout=60)
    assert resp.status_code == 200, resp.text
    return resp.json()["tokens"]


def _cached(srv, client: openai.OpenAI, messages: list[dict], prompt_tokens: int) -> int:
    resp = client.chat.completions.create(model=srv.model_id, temperature=0, max_tokens=4, messages=messages)
    assert resp.usage.prompt_tokens == prompt_tokens
    return resp.usage.prompt_tokens_details.cached_tokens


def _wait_for(index: Index, tokens: list[int], scope_tag: str | None) -> int:
    """Reads events until the index holds every whole block of `tokens` (or 30 s pass)."""
    whole = len(tokens) // BLOCK * BLOCK
    deadline = time.monotonic() + 30
    while index.predict(tokens, scope_tag) < whole and time.monotonic() < deadline:
        index.pump(0.5)
    index.pump(0.3)
    return index.predict(tokens, scope_tag)


def test_events_predict_cached_tokens_within_a_scope_and_nothing_across_tenants(setup):
    srv, index = setup
    document = _document(40)
    first, follow_up = _messages(document, "Which note mentions copper first?"), _messages(document, "Name a river.")
    alpha, alpha_too, beta = _key(srv, "alpha"), _key(srv, "alpha"), _key(srv, "beta")
    alpha_tag, beta_tag = _scope_tag("alpha"), _scope_tag("beta")

    first_tokens = _tokens(srv, alpha, first)
    assert len(first_tokens) > 4 * BLOCK, "the prompt spans several blocks"
    assert _cached(srv, alpha, first, len(first_tokens)) == 0
    assert _wait_for(index, first_tokens, alpha_tag) == len(first_tokens) // BLOCK * BLOCK
    # Every block alpha left is tainted with alpha's scope: a router that hashes plain text
    # (no scope) matches none of them.
    assert index.stored_events and all(e[8] == [[alpha_tag]] * len(e[1]) for e in index.stored_events)
    assert index.predict(first_tokens, None) == 0

    follow_tokens = _tokens(srv, alpha_too, follow_up)
    predicted = index.predict(follow_tokens, alpha_tag)
    assert predicted >= 3 * BLOCK, "the document's blocks are shared with the follow-up"
    cached = _cached(srv, alpha_too, follow_up, len(follow_tokens))
    assert predicted <= cached < predicted + BLOCK, (predicted, cached)

    # Another tenant: the events predict nothing, and nothing is reused.
    beta_tokens = _tokens(srv, beta, follow_up)
    assert beta_tokens == follow_tokens
    assert index.predict(beta_tokens, beta_tag) == 0
    assert _cached(srv, beta, follow_up, len(beta_tokens)) == 0


def test_shared_scope_blocks_go_plain_and_predict_for_any_shared_key(setup):
    srv, index = setup
    document = _document(37)
    first, follow_up = _messages(document, "Count the lanterns."), _messages(document, "Which note is last?")
    gamma, delta = _key(srv, "gamma", "shared"), _key(srv, "delta", "shared")
    first_tokens = _tokens(srv, gamma, first)
    index.pump(1.0)  # what the earlier requests left
    before = len(index.stored_events)
    assert _cached(srv, gamma, first, len(first_tokens)) == 0
    assert _wait_for(index, first_tokens, None) == len(first_tokens) // BLOCK * BLOCK
    # Into the KV cache, only gamma's blocks, plain (the earlier tenants' sequences move to host
    # memory meanwhile: "CPU", with their scope).
    gpu = [e for e in index.stored_events[before:] if e[6] == "GPU"]
    assert gpu and all(e[8] is None for e in gpu), "shared blocks carry no scope"

    # A shared key of another tenant: what a scope-unaware router predicts is what it gets.
    follow_tokens = _tokens(srv, delta, follow_up)
    predicted = index.predict(follow_tokens, None)
    assert predicted >= 3 * BLOCK
    cached = _cached(srv, delta, follow_up, len(follow_tokens))
    assert predicted <= cached < predicted + BLOCK, (predicted, cached)


def test_a_bad_endpoint_stops_the_start_with_a_clear_error():
    from _util import gantry_bin
    import subprocess

    out = subprocess.run([gantry_bin(), "serve", "--model", _models()[0], "--kv-events-endpoint", "udp://x"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "--kv-events-endpoint" in out.stderr and "tcp://HOST:PORT" in out.stderr, out.stderr
