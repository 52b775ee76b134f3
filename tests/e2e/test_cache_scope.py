"""The prompt cache is scoped per tenant (issue #33): one tenant cannot learn another's prompts
from `cached_tokens` or from the time to first token, while keys of one tenant still share their
cache, `key`-scoped keys share with no one and `shared` keys share with each other.

Every request goes through the openai SDK with keys made through the admin API (and the CLI)."""

from __future__ import annotations

import re
import subprocess
import time
import uuid

import openai
import pytest

from _util import error_body, gantry_bin, httpx
from conftest import _models, serving

ADMIN_TOKEN = "cache-scope-e2e-admin-token-0123456789"

# What a victim keeps in its prompt: a document and a secret word at its end.
SECRET = " Paris"
GUESSES = [" Rome", " Paris", " Lisbon", " Vienna", " Oslo"]


def _document(topic: str, sentences: int) -> str:
    """A long text unique to `topic`, so no two documents share more than the chat template."""
    words = ["river", "harbour", "granite", "lantern", "orchard", "meadow", "signal", "copper", "ledger", "voyage"]
    out = []
    for i in range(sentences):
        w = [words[(i * 7 + j * 3 + len(topic)) % len(words)] for j in range(6)]
        out.append(f"In {topic} note {i}, the {w[0]} near the {w[1]} kept its {w[2]} and {w[3]} beside a {w[4]} {w[5]}.")
    return " ".join(out)


@pytest.fixture(scope="module")
def srv():
    with serving(_models()[0], ("--admin-token", ADMIN_TOKEN)) as (server, _client):
        yield server


def _admin(srv, method: str, path: str, body: dict | None = None):
    return httpx.request(method, f"{srv.root_url}/admin/v1{path}", json=body,
                         headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60)


def _key(srv, tenant: str, cache_scope: str | None = None) -> openai.OpenAI:
    body = {"name": f"{tenant}-{uuid.uuid4().hex[:8]}", "tenant": tenant}
    if cache_scope is not None:
        body["cache_scope"] = cache_scope
    resp = _admin(srv, "POST", "/keys", body)
    assert resp.status_code == 201, resp.text
    assert resp.json()["cache_scope"] == (cache_scope or "tenant")
    return openai.OpenAI(base_url=srv.base_url, api_key=resp.json()["secret"], max_retries=0, timeout=300)


def _ask(srv, client: openai.OpenAI, text: str):
    return client.chat.completions.create(
        model=srv.model_id, temperature=0, max_tokens=1, messages=[{"role": "user", "content": text}])


def _cached(resp) -> int:
    return resp.usage.prompt_tokens_details.cached_tokens


def _computed_tokens(srv) -> float:
    """Tokens llama.cpp decoded so far: prompt tokens actually computed plus generated ones."""
    text = httpx.get(f"{srv.root_url}/metrics", timeout=30).text
    m = re.search(r"^gantry_batch_tokens_sum(?:\{[^}]*\})? (\S+)$", text, re.M)
    assert m, "gantry_batch_tokens is exported"
    return float(m.group(1))


def test_another_tenant_reads_nothing_from_cached_tokens(srv):
    doc = _document("victim-one", 12)
    victim = _key(srv, "victim-one")
    first = _ask(srv, victim, doc + SECRET)
    assert _cached(first) == 0
    # Each guess from an attacker that has sent nothing before: no reuse at all, right guess or not.
    for guess in GUESSES:
        attacker = _key(srv, f"attacker-{uuid.uuid4().hex[:6]}")
        probe = _ask(srv, attacker, doc + guess)
        assert _cached(probe) == 0, (guess, probe.usage)
    # One attacker trying every guess in turn reuses its own earlier guesses, and the right guess
    # gets exactly what a wrong one gets.
    attacker = _key(srv, "attacker-many")
    counts = {guess: _cached(_ask(srv, attacker, doc + guess)) for guess in GUESSES}
    later = [counts[g] for g in GUESSES[1:]]
    assert len(set(later)) == 1, f"the right guess stands out: {counts}"
    # Another key of the victim's tenant does reuse the victim's prompt: the secret's position shows.
    colleague = _key(srv, "victim-one")
    same = _ask(srv, colleague, doc + SECRET)
    assert _cached(same) == same.usage.prompt_tokens - 1, same.usage
    assert _cached(same) > max(later), (same.usage, counts)


def test_key_scoped_keys_share_with_no_one_and_shared_keys_share(srv):
    doc = _document("scoped", 10)
    own = _key(srv, "tenant-k", "key")
    sibling = _key(srv, "tenant-k")
    assert _cached(_ask(srv, own, doc)) == 0
    assert _cached(_ask(srv, sibling, doc)) == 0, "a key-scoped key's prompt is not its tenant's"
    again = _ask(srv, own, doc)
    assert _cached(again) == again.usage.prompt_tokens - 1, "the key still reuses its own prompts"
    other_own = _key(srv, "tenant-k", "key")
    assert _cached(_ask(srv, other_own, doc)) == 0, "another key-scoped key of the tenant"

    shared_doc = _document("shared", 10)
    shared_a = _key(srv, "tenant-a", "shared")
    shared_b = _key(srv, "tenant-b", "shared")
    assert _cached(_ask(srv, shared_a, shared_doc)) == 0
    hit = _ask(srv, shared_b, shared_doc)
    assert _cached(hit) == hit.usage.prompt_tokens - 1, "shared keys share, across tenants"
    assert _cached(_ask(srv, _key(srv, "tenant-a"), shared_doc)) == 0, "tenant-a's own scope is not the shared one"


def _ttft(srv, client: openai.OpenAI, text: str) -> float:
    started = time.perf_counter()
    stream = client.chat.completions.create(
        model=srv.model_id, temperature=0, max_tokens=1, stream=True, messages=[{"role": "user", "content": text}])
    first = None
    for chunk in stream:
        # The first chunk (role, empty content) is sent on admission, before the prompt is
        # computed: the first token is the first chunk with text, or the end if it had none.
        if first is None and chunk.choices and (chunk.choices[0].delta.content or chunk.choices[0].finish_reason):
            first = time.perf_counter() - started
    assert first is not None, "a first token"
    return first


def test_another_tenants_document_is_not_faster_to_first_token(srv):
    victim, attacker, colleague = _key(srv, "ttft-victim"), _key(srv, "ttft-attacker"), _key(srv, "ttft-victim")
    doc = _document("ttft-secret", 55)  # ~1,400 tokens: a fresh prefill takes far longer than a cached one
    victim_ttft = _ttft(srv, victim, doc)
    fresh = [_ttft(srv, attacker, _document("ttft-fresh-one", 55))]
    before = _computed_tokens(srv)
    probe = _ask(srv, _key(srv, "ttft-prober"), doc)
    computed = _computed_tokens(srv) - before
    assert _cached(probe) == 0, probe.usage
    assert computed >= probe.usage.prompt_tokens, f"only {computed} of {probe.usage.prompt_tokens} prompt tokens computed"
    attacker_ttft = _ttft(srv, _key(srv, "ttft-attacker-two"), doc)
    fresh.append(_ttft(srv, attacker, _document("ttft-fresh-two", 55)))
    assert attacker_ttft >= 0.5 * min(fresh), f"attacker {attacker_ttft:.3f}s, fresh {fresh}, victim {victim_ttft:.3f}s"
    # The same document within the victim's tenant is cached, and the counter shows it.
    before = _computed_tokens(srv)
    hit = _ask(srv, colleague, doc)
    assert _computed_tokens(srv) - before <= 2, "the colleague's prompt came from the cache"
    assert _cached(hit) == hit.usage.prompt_tokens - 1


def test_cache_scope_round_trips_through_the_admin_api_and_the_cli(srv):
    created = _admin(srv, "POST", "/keys", {"name": "scope-admin", "cache_scope": "key"})
    assert created.status_code == 201 and created.json()["cache_scope"] == "key", created.text
    assert _admin(srv, "GET", "/keys/scope-admin").json()["cache_scope"] == "key"
    patched = _admin(srv, "PATCH", "/keys/scope-admin", {"cache_scope": "shared"})
    assert patched.status_code == 200 and patched.json()["cache_scope"] == "shared", patched.text
    untouched = _admin(srv, "PATCH", "/keys/scope-admin", {"rpm_limit": 50})
    assert untouched.json()["cache_scope"] == "shared"
    listed = {k["name"]: k["cache_scope"] for k in _admin(srv, "GET", "/keys").json()["data"]}
    assert listed["scope-admin"] == "shared"
    plain = _admin(srv, "POST", "/keys", {"name": "scope-plain"})
    assert plain.json()["cache_scope"] == "tenant", "the default"
    for bad in ("org", "", 3):
        resp = _admin(srv, "POST", "/keys", {"name": "scope-bad", "cache_scope": bad})
        assert resp.status_code == 400, resp.text
        err = error_body(resp)
        assert err["param"] == "cache_scope" and "tenant" in err["message"], err

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([gantry_bin(), "keys", *args, "--data-dir", srv.data_dir],
                              capture_output=True, text=True, timeout=120)

    made = cli("create", "--name", "scope-cli", "--tenant", "cli", "--cache-scope", "key")
    assert made.returncode == 0, made.stderr
    assert _admin(srv, "GET", "/keys/scope-cli").json()["cache_scope"] == "key", "the server reads what the CLI wrote"
    assert cli("update", "scope-cli", "--cache-scope", "tenant").returncode == 0
    shown = cli("show", "scope-cli", "--format", "json")
    assert '"cache_scope": "tenant"' in shown.stdout, shown.stdout
    listing = cli("list")
    row = next(line for line in listing.stdout.splitlines() if "scope-admin" in line)
    assert row.split()[-2:] == ["shared", "1"], row  # its cache scope, then its weight
    refused = cli("update", "scope-cli", "--cache-scope", "org")
    assert refused.returncode != 0 and "tenant, key or shared" in refused.stderr, refused.stderr
