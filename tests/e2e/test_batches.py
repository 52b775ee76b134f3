"""OpenAI's Files and Batch APIs through the official SDK, against the real binary.

A key uploads a JSONL file of requests (`files.create(purpose="batch")`) and submits it
(`batches.create`); the server runs its lines as that key at the lowest priority, on sequences
interactive requests leave free, and writes each answer to an output file (failures to an error
file) that `files.content` reads back. Checked here:

- a batch of 200 chat lines completes: every line answered exactly once and by its own request
  (each line asks for its own length), the batch's counts and usage add up, and the ledger holds
  exactly one row per line, in tier `batch`, at half the model's `--price`, and the usage report
  totals the batch in a row of its own; completions and
  responses lines too, and embeddings lines where all-MiniLM-L6-v2 is pulled (skipped, and said
  so, where it is not);
- files: the File object, the content byte for byte, listing and paging, deleting, purposes other
  than `batch` refused, the size limit (413 naming it) and the per-key limits;
- a file with a bad line gives a `failed` batch naming the line (1-based); a bad window or endpoint
  is a 400, an unknown file a 404;
- a second key can neither see, read, delete, submit nor cancel the first key's files and batches,
  and lists only its own;
- batch lines are outside the key's tokens per minute but inside its budget;
- cancelling halfway: the finished lines are in the output and billed once each (at the
  `--price MODEL@batch=` price), the rest are in the error file as `batch_cancelled` and billed
  nothing;
- `kill -9` mid-batch, then a restart on the same data directory: the batch completes, every line
  answered once and billed once;
- an interactive request sent while a batch line holds the only sequence preempts it: the line
  runs again later, is answered once, and is billed once, for the run it delivers.

Nothing is asserted on the clock: batches and the ledger are polled with generous deadlines."""

from __future__ import annotations

import json
import math
import shutil
import sqlite3
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from _util import error_body, httpx, user
from conftest import _cache_dir, _models, _start, _stop, serving

ADMIN_TOKEN = "batches-e2e-admin-token-0123456789abcdef"
CHAT = "/v1/chat/completions"
PROMPT = "Say hi."
COUNT = "Write a long Python script that prints the numbers from 1 to 100, with a comment on every line."
# USD per million prompt and completion tokens of the default tier; batch lines cost half.
PRICE = (1000, 2000)
BATCH_PRICE = (500, 1000)
EMBEDDER, EMBEDDER_GGUF = "minilm", "all-MiniLM-L6-v2-f32.gguf"
TERMINAL = {"completed", "failed", "expired", "cancelled"}
MAX_FILE_BYTES = 1_048_576
FILES_PER_KEY = 16
FILE_BYTES_PER_KEY = 4 * MAX_FILE_BYTES
FILE_KEYS = {"id", "object", "bytes", "created_at", "filename", "purpose", "status", "expires_at", "status_details"}
LIST_KEYS = {"object", "data", "first_id", "last_id", "has_more"}


def _model_name(model: str) -> str:
    return Path(model).stem if model.endswith(".gguf") else model


def _embedder_pulled() -> bool:
    return (_cache_dir() / "models" / EMBEDDER_GGUF).is_file()


@pytest.fixture(scope="module")
def srv():
    """The server of most tests: four sequences, four batch lines at once, and file limits low
    enough for one test to reach (the other tests stay far below them)."""
    model = _models()[0]
    extra = ("--admin-token", ADMIN_TOKEN, "--price", f"{_model_name(model)}={PRICE[0]},{PRICE[1]}",
             "--batch-concurrency", "4", "--max-file-bytes", str(MAX_FILE_BYTES),
             "--files-per-key", str(FILES_PER_KEY), "--file-bytes-per-key", str(FILE_BYTES_PER_KEY))
    if _embedder_pulled():
        extra += ("--model", f"{EMBEDDER}=all-minilm-l6-v2")
    with serving(model, extra, ("--ctx-size", "1024", "--parallel", "4")) as (server, _):
        yield server


@dataclass
class Key:
    name: str
    secret: str
    client: openai.OpenAI


def _admin(srv, method: str, path: str, body: dict | None = None, params: dict | None = None):
    return httpx.request(method, f"{srv.root_url}/admin/v1{path}", json=body, params=params,
                         headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60)


def _client(srv, secret: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key=secret, max_retries=0, timeout=300)


def _key(srv, **settings) -> Key:
    name = f"batch-{uuid.uuid4().hex[:8]}"
    resp = _admin(srv, "POST", "/keys", {"name": name, **settings})
    assert resp.status_code == 201, resp.text
    secret = resp.json()["secret"]
    return Key(name, secret, _client(srv, secret))


def _get(srv, key: Key, path: str, params: dict | None = None):
    """A raw GET on /v1 as `key`: the JSON exactly as sent, not as the SDK parses it."""
    return httpx.get(f"{srv.base_url}{path}", params=params, headers={"Authorization": f"Bearer {key.secret}"}, timeout=60)


def _chat_line(model: str, custom_id: str, max_tokens: int = 2, content: str = PROMPT, **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": CHAT,
            "body": {"model": model, "messages": user(content), "max_tokens": max_tokens, "temperature": 0, **body}}


def _jsonl(lines) -> bytes:
    """JSON lines; a str is written as it is (a broken line)."""
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines).encode()


def _padded(size: int) -> bytes:
    """One valid chat line, padded to exactly `size` bytes (its newline included)."""
    line = _chat_line("m", "pad", content="")
    base = len(json.dumps(line)) + 1
    assert size >= base
    line["body"]["messages"][0]["content"] = "x" * (size - base)
    data = (json.dumps(line) + "\n").encode()
    assert len(data) == size
    return data


def _upload(client: openai.OpenAI, data: bytes, filename: str = "in.jsonl"):
    return client.files.create(file=(filename, data, "application/jsonl"), purpose="batch")


def _submit(client: openai.OpenAI, lines, endpoint: str = CHAT, **create):
    f = _upload(client, _jsonl(lines))
    return client.batches.create(input_file_id=f.id, endpoint=endpoint, completion_window="24h", **create)


def _completed_at_least(n: int):
    return lambda b: b.request_counts is not None and b.request_counts.completed >= n


def _wait(srv, client: openai.OpenAI, batch_id: str, done=lambda b: b.status in TERMINAL,
          what: str = "a final status", deadline_s: float = 900):
    """Polls the batch until `done(batch)`; fails if it ends first or the deadline passes."""
    deadline = time.monotonic() + deadline_s
    while True:
        b = client.batches.retrieve(batch_id)
        if done(b):
            return b
        assert b.status not in TERMINAL, f"the batch ended {b.status} before {what}: {b.to_dict()}\n{srv.stderr_tail()}"
        assert time.monotonic() < deadline, f"the batch reached no {what} in {deadline_s} s: {b.to_dict()}\n{srv.stderr_tail()}"
        time.sleep(0.2)


def _read(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    """The JSON lines of an output or error file (none when the batch has no such file)."""
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines() if line.strip()]


def _ledger(srv, key_name: str, ids: set[str], deadline_s: float = 120) -> list[dict]:
    """The key's rows of the per-request usage listing, once every request id in `ids` is there
    (the ledger is written behind the answers)."""
    deadline = time.monotonic() + deadline_s
    while True:
        resp = _admin(srv, "GET", "/usage/requests", params={"key_name": key_name})
        assert resp.status_code == 200, resp.text
        rows = resp.json()["data"]
        missing = ids - {r["request_id"] for r in rows}
        if not missing:
            return rows
        assert time.monotonic() < deadline, f"the ledger never held {len(missing)} of {len(ids)} lines, e.g. {sorted(missing)[:3]}"
        time.sleep(0.2)


def _ended_halfway(client: openai.OpenAI, done, lines: list[dict], tokens: int, code: str) -> list[dict]:
    """Checks the files of a batch cancelled or expired halfway: the finished lines answered in
    full in the output, every other line in the error file with `code`; returns the output."""
    n = len(lines)
    out, errors = _read(client, done.output_file_id), _read(client, done.error_file_id)
    assert 2 <= len(out) < n, f"{len(out)} of {n} lines answered: not ended halfway"
    assert Counter(line["custom_id"] for line in out + errors) == Counter(line["custom_id"] for line in lines), \
        "every line is in one file, once"
    for line in out:
        assert line["response"]["status_code"] == 200, line
        assert line["response"]["body"]["usage"]["completion_tokens"] == tokens, "a finished line ran to its end"
    for line in errors:
        assert line["response"] is None and line["id"].startswith("batch_req_"), line
        assert line["error"]["code"] == code and line["error"]["message"], line
    assert (done.request_counts.total, done.request_counts.completed) == (n, len(out)), done.to_dict()
    return out


def _refused(what: str, call, status: int) -> dict:
    """Asserts `call` fails with `status` and OpenAI's error shape; returns the error."""
    try:
        got = call()
    except openai.APIStatusError as e:
        assert e.status_code == status, f"{what}: {e.status_code}, not {status}: {e.response.text}"
        return error_body(e.response)
    pytest.fail(f"{what}: answered {got!r}, not {status}")


def _refused_4xx(what: str, call) -> dict:
    """Asserts `call` fails with a 4xx and OpenAI's error shape; returns the error and its status."""
    try:
        got = call()
    except openai.APIStatusError as e:
        assert 400 <= e.status_code < 500, f"{what}: {e.status_code}: {e.response.text}"
        return {**error_body(e.response), "status": e.status_code}
    pytest.fail(f"{what}: answered {got!r}, not a 4xx")


def _check_batch_rows(rows: list[dict], batch_id: str, price: tuple[int, int]) -> None:
    for r in rows:
        assert r["service_tier"] == "batch", r
        assert r.get("batch_id") == batch_id, r
        # No cached price was given: cached prompt tokens cost the input rate.
        expected = (r["prompt_tokens"] * price[0] + r["completion_tokens"] * price[1]) / 1e6
        assert r["cost"] == pytest.approx(expected, rel=1e-6), (price, r)


def _prompt_tokens(srv) -> int:
    """The prompt tokens of a PROMPT line's request, measured through a key of its own."""
    answer = _key(srv).client.chat.completions.create(model=srv.model_id, messages=user(PROMPT), max_tokens=1, temperature=0)
    return answer.usage.prompt_tokens


def test_two_hundred_chat_lines_complete_once_each_billed_once_at_the_batch_price(srv):
    key = _key(srv)
    n = 200
    # Each line asks for its own length (1 or 2 tokens; any answer to PROMPT is longer): an answer filed under
    # another line's custom_id shows.
    lines = [_chat_line(srv.model_id, f"line-{i:03d}", max_tokens=1 + i % 2) for i in range(n)]
    asked = {line["custom_id"]: line["body"]["max_tokens"] for line in lines}
    inp = _upload(key.client, _jsonl(lines))
    batch = key.client.batches.create(input_file_id=inp.id, endpoint=CHAT, completion_window="24h",
                                      metadata={"run": "e2e-200"})
    assert batch.id.startswith("batch_") and batch.object == "batch", batch.to_dict()
    assert (batch.endpoint, batch.input_file_id, batch.completion_window) == (CHAT, inp.id, "24h"), batch.to_dict()
    assert batch.metadata == {"run": "e2e-200"}, batch.to_dict()
    assert batch.status in ("validating", "in_progress", "finalizing", "completed"), batch.to_dict()

    done = _wait(srv, key.client, batch.id)
    assert done.status == "completed", done.to_dict()
    counts = done.request_counts
    assert (counts.total, counts.completed, counts.failed) == (n, n, 0), done.to_dict()
    assert done.created_at <= done.in_progress_at <= done.finalizing_at <= done.completed_at, done.to_dict()
    assert abs(done.expires_at - (done.created_at + 24 * 3600)) <= 1, done.to_dict()
    assert (done.failed_at, done.cancelling_at, done.cancelled_at, done.expired_at) == (None,) * 4, done.to_dict()
    assert done.metadata == {"run": "e2e-200"}, done.to_dict()

    output = key.client.files.retrieve(done.output_file_id)
    raw = key.client.files.content(done.output_file_id).content
    assert (output.purpose, output.bytes) == ("batch_output", len(raw)), output.to_dict()
    assert _read(key.client, done.error_file_id) == []
    out = _read(key.client, done.output_file_id)
    assert Counter(line["custom_id"] for line in out) == Counter(list(asked)), "every line answered exactly once"
    for line in out:
        assert set(line) == {"id", "custom_id", "response", "error"}, line
        assert line["id"].startswith("batch_req_") and line["error"] is None, line
        response = line["response"]
        assert response["status_code"] == 200 and isinstance(response["request_id"], str) and response["request_id"], line
        body = response["body"]
        assert (body["object"], body["model"]) == ("chat.completion", srv.model_id), body
        assert body["choices"][0]["message"]["role"] == "assistant", body
        usage = body["usage"]
        assert usage["completion_tokens"] == asked[line["custom_id"]], line
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"], usage
    assert len({line["id"] for line in out}) == n, "line ids are unique"

    told = {line["id"]: line["response"]["body"]["usage"] for line in out}
    prompt = sum(u["prompt_tokens"] for u in told.values())
    completion = sum(u["completion_tokens"] for u in told.values())
    assert (done.usage.input_tokens, done.usage.output_tokens, done.usage.total_tokens) == (prompt, completion, prompt + completion)

    rows = _ledger(srv, key.name, set(told))
    assert Counter(r["request_id"] for r in rows) == Counter(list(told)), "exactly one ledger row per line, and no other"
    for r in rows:
        u = told[r["request_id"]]
        assert (r["prompt_tokens"], r["completion_tokens"]) == (u["prompt_tokens"], u["completion_tokens"]), (r, u)
    _check_batch_rows(rows, done.id, BATCH_PRICE)
    assert done.usage.input_tokens_details.cached_tokens == sum(r["cached_tokens"] for r in rows)
    # The usage report totals the batch in a row of its own.
    report = _admin(srv, "GET", "/usage", params={"batch_id": done.id}).json()["data"]
    assert [(r["batch_id"], r["service_tier"], r["requests"], r["prompt_tokens"]) for r in report] == [
        (done.id, "batch", n, prompt)], report


def test_completions_and_responses_lines_answer_in_their_endpoints_shape(srv):
    key = _key(srv)
    completions = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
                    "body": {"model": srv.model_id, "prompt": "def add(a, b):", "max_tokens": 2, "temperature": 0}}
                   for i in range(2)]
    responses = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/responses",
                  "body": {"model": srv.model_id, "input": PROMPT, "max_output_tokens": 16, "temperature": 0}}
                 for i in range(2)]
    submitted = [(_submit(key.client, completions, "/v1/completions"), "text_completion", {"c0", "c1"}),
                 (_submit(key.client, responses, "/v1/responses"), "response", {"r0", "r1"})]
    ids = set()
    for batch, kind, custom_ids in submitted:
        done = _wait(srv, key.client, batch.id)
        assert done.status == "completed" and done.endpoint == batch.endpoint, done.to_dict()
        assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (2, 2, 0)
        out = _read(key.client, done.output_file_id)
        assert sorted(line["custom_id"] for line in out) == sorted(custom_ids), out
        for line in out:
            body = line["response"]["body"]
            assert line["response"]["status_code"] == 200 and body["object"] == kind, line
            if kind == "text_completion":
                assert 1 <= body["usage"]["completion_tokens"] <= 2 and isinstance(body["choices"][0]["text"], str), body
            else:
                assert body["status"] in ("completed", "incomplete") and body["usage"]["output_tokens"] >= 1, body
        ids |= {line["id"] for line in out}
    rows = _ledger(srv, key.name, ids)
    assert Counter(r["request_id"] for r in rows) == Counter(ids)
    assert all(r["service_tier"] == "batch" for r in rows), rows


def test_an_embeddings_batch_gives_the_interactive_vectors(srv):
    if not _embedder_pulled():
        pytest.skip("all-minilm-l6-v2 is not pulled: run `gantry models pull all-minilm-l6-v2`")
    key = _key(srv)
    texts = ["The Eiffel Tower is in Paris.", "Plants turn light into sugar.", "Tuples are immutable."]
    lines = [{"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": EMBEDDER, "input": t, "encoding_format": "float"}} for i, t in enumerate(texts)]
    done = _wait(srv, key.client, _submit(key.client, lines, "/v1/embeddings").id)
    assert done.status == "completed", done.to_dict()
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (3, 3, 0)
    out = {line["custom_id"]: line for line in _read(key.client, done.output_file_id)}
    assert sorted(out) == ["e0", "e1", "e2"], out
    direct = key.client.embeddings.create(model=EMBEDDER, input=texts, encoding_format="float")
    for i in range(len(texts)):
        body = out[f"e{i}"]["response"]["body"]
        assert (body["object"], body["model"]) == ("list", EMBEDDER), body
        got, want = body["data"][0]["embedding"], direct.data[i].embedding
        assert len(got) == len(want) == 384
        cosine = sum(a * b for a, b in zip(got, want)) / math.sqrt(sum(a * a for a in got) * sum(b * b for b in want))
        assert cosine >= 0.9999, (i, cosine)
    ids = {line["id"] for line in out.values()}
    rows = [r for r in _ledger(srv, key.name, ids) if r["service_tier"] == "batch"]
    assert Counter(r["request_id"] for r in rows) == Counter(ids), rows
    for r in rows:
        line = next(line for line in out.values() if line["id"] == r["request_id"])
        assert r["model"] == EMBEDDER and r["prompt_tokens"] == line["response"]["body"]["usage"]["prompt_tokens"], (r, line)


def test_a_file_is_stored_listed_read_back_and_deleted(srv):
    key = _key(srv)
    data = _jsonl([_chat_line(srv.model_id, "only")])
    f = _upload(key.client, data)
    assert f.id.startswith("file-") and f.object == "file", f.to_dict()
    assert (f.bytes, f.filename, f.purpose, f.status) == (len(data), "in.jsonl", "batch", "processed"), f.to_dict()
    assert f.expires_at is None and f.status_details is None, f.to_dict()
    assert 1_600_000_000 < f.created_at < 10_000_000_000, "created_at is in seconds"
    shown = _get(srv, key, f"/files/{f.id}")
    assert shown.status_code == 200 and set(shown.json()) == FILE_KEYS, shown.text
    assert key.client.files.retrieve(f.id).to_dict() == f.to_dict()
    assert key.client.files.content(f.id).content == data, "the content comes back byte for byte"

    more = [_upload(key.client, _jsonl([_chat_line(srv.model_id, f"more-{i}")]), f"more-{i}.jsonl") for i in range(2)]
    ids = {f.id, *(m.id for m in more)}
    assert {x.id for x in key.client.files.list(purpose="batch")} == ids
    assert list(key.client.files.list(purpose="batch_output")) == []
    asc = [x.id for x in key.client.files.list(order="asc")]
    desc = [x.id for x in key.client.files.list(order="desc")]
    assert set(asc) == ids and asc == desc[::-1], (asc, desc)
    page = key.client.files.list(order="asc", limit=2)
    assert [x.id for x in page.data] == asc[:2] and page.has_more is True
    rest = key.client.files.list(order="asc", limit=2, after=page.data[-1].id)
    assert [x.id for x in rest.data] == asc[2:] and rest.has_more is False
    listed = _get(srv, key, "/files", {"order": "asc", "limit": 2}).json()
    assert set(listed) == LIST_KEYS and listed["object"] == "list", listed
    assert (listed["first_id"], listed["last_id"], listed["has_more"]) == (asc[0], asc[1], True), listed

    gone = key.client.files.delete(more[0].id)
    assert (gone.id, gone.object, gone.deleted) == (more[0].id, "file", True), gone.to_dict()
    _refused("retrieve a deleted file", lambda: key.client.files.retrieve(more[0].id), 404)
    _refused("read a deleted file", lambda: key.client.files.content(more[0].id), 404)
    _refused("delete a deleted file", lambda: key.client.files.delete(more[0].id), 404)
    assert {x.id for x in key.client.files.list()} == ids - {more[0].id}

    for purpose in ("fine-tune", "assistants", "batch_output"):
        err = _refused(f"purpose {purpose}", lambda: key.client.files.create(
            file=("in.jsonl", data, "application/jsonl"), purpose=purpose), 400)
        assert (err["type"], err["param"]) == ("invalid_request_error", "purpose"), err
    assert len(list(key.client.files.list())) == 2, "refused uploads stored nothing"


def test_a_file_over_the_size_or_a_key_over_its_quota_is_refused(srv):
    key = _key(srv)
    # One byte over, read whole; and ten times over, cut off at the route's body limit.
    for size in (MAX_FILE_BYTES + 1, 10 * MAX_FILE_BYTES):
        err = _refused("a file over --max-file-bytes", lambda: _upload(key.client, _padded(size)), 413)
        assert (err["code"], err["param"]) == ("request_too_large", "file"), err
        assert f"at most {MAX_FILE_BYTES} bytes" in err["message"], err
    # 4,000,000 bytes held of 4 MiB: the next 1,000,000 do not fit until one file is deleted.
    held = [_upload(key.client, _padded(1_000_000)) for _ in range(4)]
    _refused_4xx("bytes over --file-bytes-per-key", lambda: _upload(key.client, _padded(1_000_000)))
    key.client.files.delete(held[0].id)
    assert _upload(key.client, _padded(1_000_000)).bytes == 1_000_000, "deleting frees the key's bytes"

    counted = _key(srv)
    small = [_upload(counted.client, _padded(200)) for _ in range(FILES_PER_KEY)]
    _refused_4xx("a file over --files-per-key", lambda: _upload(counted.client, _padded(200)))
    counted.client.files.delete(small[0].id)
    assert _upload(counted.client, _padded(200)).bytes == 200, "deleting frees a file of the key's count"


def test_one_file_submitted_again_cannot_fill_the_database(srv):
    """A batch copies its file's requests: they count toward the key's quota until it finishes,
    so submitting one file over and over is refused once the copies reach it."""
    key = _key(srv)
    lines = [_chat_line(srv.model_id, f"q{i:04d}", content="x" * 980) for i in range(850)]
    data = _jsonl(lines)
    assert 900_000 < len(data) < MAX_FILE_BYTES, len(data)
    upload = _upload(key.client, data)
    create = lambda: key.client.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="24h")
    accepted = []
    try:
        # The file and three copies of its requests (each about 0.93 MB) fit in 4 MiB; a fourth does not.
        for _ in range(3):
            accepted.append(create())
        err = _refused_4xx("a fourth copy of the same file past the key's quota", create)
        assert err["code"] == "storage_limit_exceeded" and "quota" in err["message"], err
        assert {b.id for b in key.client.batches.list()} == {b.id for b in accepted}, "the refused batch left nothing"
    finally:
        for b in accepted:
            key.client.batches.cancel(b.id)
    for b in accepted:
        assert _wait(srv, key.client, b.id).status == "cancelled"
    # Finished, their copies are gone: the same file may be submitted again.
    again = create()
    key.client.batches.cancel(again.id)
    assert _wait(srv, key.client, again.id).status == "cancelled"


def test_a_bad_line_fails_the_batch_naming_the_line(srv):
    key = _key(srv)
    m = srv.model_id

    def ok(custom_id: str) -> dict:
        return _chat_line(m, custom_id)

    no_custom_id = ok("c")
    del no_custom_id["custom_id"]
    cases = {  # what is wrong: (the file's lines, the 1-based line that is wrong)
        "bad JSON": ([ok("a"), '{"custom_id": "b", "method": "POST",'], 2),
        "no custom_id": ([ok("a"), ok("b"), no_custom_id], 3),
        "a duplicate custom_id": ([ok("a"), ok("b"), ok("a")], 3),
        "another endpoint's url": ([ok("a"), {**ok("b"), "url": "/v1/completions"}], 2),
        "a method other than POST": ([{**ok("a"), "method": "GET"}, ok("b")], 1),
        "an unknown model": ([ok("a"), ok("b"), ok("c"), _chat_line("no-such-model", "d")], 4),
        "a body that is no object": ([ok("a"), {**ok("b"), "body": ["not", "an", "object"]}], 2),
    }
    for what, (lines, wrong) in cases.items():
        done = _wait(srv, key.client, _submit(key.client, lines).id)
        assert done.status == "failed" and done.failed_at is not None, (what, done.to_dict())
        errors = (done.errors.data or []) if done.errors is not None else []
        assert errors, (what, done.to_dict())
        assert [e.line for e in errors] == [wrong] * len(errors), (what, [e.to_dict() for e in errors])
        for e in errors:
            assert isinstance(e.code, str) and e.code and isinstance(e.message, str) and e.message, (what, e.to_dict())
        assert done.output_file_id is None, (what, done.to_dict())
        assert done.request_counts is None or done.request_counts.completed == 0, (what, done.to_dict())


def test_create_refuses_a_bad_window_or_endpoint_and_an_unknown_file(srv):
    key = _key(srv)
    f = _upload(key.client, _jsonl([_chat_line(srv.model_id, "a")]))
    for field, value in (("completion_window", "1h"), ("completion_window", "48h"),
                         ("endpoint", "/v1/moderations"), ("endpoint", "/v1/chat/completion")):
        args = {"input_file_id": f.id, "endpoint": CHAT, "completion_window": "24h", field: value}
        err = _refused(f"{field} {value}", lambda: key.client.batches.create(**args), 400)
        assert (err["type"], err["param"]) == ("invalid_request_error", field), err
    _refused("an unknown file", lambda: key.client.batches.create(
        input_file_id="file-does-not-exist", endpoint=CHAT, completion_window="24h"), 404)
    key.client.files.delete(f.id)
    _refused("a deleted file", lambda: key.client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h"), 404)
    _refused("an unknown batch", lambda: key.client.batches.retrieve("batch_does_not_exist"), 404)
    _refused("cancelling an unknown batch", lambda: key.client.batches.cancel("batch_does_not_exist"), 404)
    assert list(key.client.batches.list()) == [], "nothing was created"


def test_a_key_sees_nothing_of_another_keys_files_and_batches(srv):
    a, b = _key(srv), _key(srv)
    a_data = _jsonl([_chat_line(srv.model_id, f"a{i}", max_tokens=4) for i in range(2)])
    a_file = _upload(a.client, a_data)
    a_batch = a.client.batches.create(input_file_id=a_file.id, endpoint=CHAT, completion_window="24h")
    b_file = _upload(b.client, _jsonl(["not json"]))
    b_batch = b.client.batches.create(input_file_id=b_file.id, endpoint=CHAT, completion_window="24h")
    attempts = {
        "retrieve A's file": lambda: b.client.files.retrieve(a_file.id),
        "read A's file": lambda: b.client.files.content(a_file.id),
        "delete A's file": lambda: b.client.files.delete(a_file.id),
        "submit A's file": lambda: b.client.batches.create(input_file_id=a_file.id, endpoint=CHAT, completion_window="24h"),
        "retrieve A's batch": lambda: b.client.batches.retrieve(a_batch.id),
        "cancel A's batch": lambda: b.client.batches.cancel(a_batch.id),
    }
    for what, attempt in attempts.items():
        _refused(what, attempt, 404)

    done = _wait(srv, a.client, a_batch.id)
    assert done.status == "completed" and done.request_counts.completed == 2, ("B's cancel did nothing", done.to_dict())
    _refused("read A's output", lambda: b.client.files.content(done.output_file_id), 404)
    _refused("retrieve A's output", lambda: b.client.files.retrieve(done.output_file_id), 404)
    assert a.client.files.content(a_file.id).content == a_data, "A's file is whole"

    b_done = _wait(srv, b.client, b_batch.id)
    assert {f.id for f in a.client.files.list()} == {a_file.id, done.output_file_id, done.error_file_id} - {None}
    assert {f.id for f in b.client.files.list()} == {b_file.id, b_done.output_file_id, b_done.error_file_id} - {None}
    assert [x.id for x in a.client.batches.list()] == [a_batch.id]
    assert [x.id for x in b.client.batches.list()] == [b_batch.id]


def test_batches_are_listed_a_page_at_a_time(srv):
    key = _key(srv)
    made = [_submit(key.client, ["not json"]).id for _ in range(3)]  # they fail validation: nothing runs
    page = key.client.batches.list(limit=2)
    assert len(page.data) == 2 and page.has_more is True, page
    rest = key.client.batches.list(limit=2, after=page.data[-1].id)
    assert len(rest.data) == 1 and rest.has_more is False, rest
    seen = [x.id for x in page.data + rest.data]
    assert sorted(seen) == sorted(made), (seen, made)
    assert [x.id for x in key.client.batches.list()] == seen, "one order, page after page"
    listed = _get(srv, key, "/batches", {"limit": 2}).json()
    assert set(listed) == LIST_KEYS and listed["object"] == "list", listed
    assert (listed["first_id"], listed["last_id"], listed["has_more"]) == (seen[0], seen[1], True), listed


def test_batch_lines_are_outside_the_keys_tokens_per_minute(srv):
    per_line = _prompt_tokens(srv) + 2
    tpm = 4 * per_line
    key = _key(srv, tpm_limit=tpm)
    n = 12
    done = _wait(srv, key.client, _submit(key.client, [_chat_line(srv.model_id, f"t{i}") for i in range(n)]).id)
    assert done.status == "completed", done.to_dict()
    assert (done.request_counts.completed, done.request_counts.failed) == (n, 0), done.to_dict()
    assert done.usage.total_tokens > tpm, "the batch used more than a minute's tokens: the test means something"
    # The minute's tokens are all still there for the key's interactive requests; they run out.
    admitted = 0
    for _ in range(10):
        try:
            answer = key.client.chat.completions.create(model=srv.model_id, messages=user(PROMPT), max_tokens=2, temperature=0)
        except openai.RateLimitError as e:
            assert error_body(e.response)["code"] == "rate_limit_exceeded"
            break
        assert answer.service_tier == "default"
        admitted += 1
    else:
        pytest.fail("the key's tokens per minute never ran out: the limit is not applied")
    assert admitted >= 1, "the batch's lines spent the key's tokens per minute"


def test_batch_lines_are_billed_against_the_keys_budget(srv):
    per_line = _prompt_tokens(srv) + 2
    budget = 3 * per_line
    key = _key(srv, budget_tokens=budget)
    n = 10
    lines = [_chat_line(srv.model_id, f"b{i}") for i in range(n)]
    done = _wait(srv, key.client, _submit(key.client, lines).id)
    assert done.status == "completed", done.to_dict()
    counts = done.request_counts
    assert counts.total == n and counts.completed + counts.failed == n, done.to_dict()
    assert 1 <= counts.completed <= 3, f"a budget of {budget} tokens fits 3 lines of {per_line}: {done.to_dict()}"
    out, errors = _read(key.client, done.output_file_id), _read(key.client, done.error_file_id)
    assert (len(out), len(errors)) == (counts.completed, counts.failed)
    assert Counter(line["custom_id"] for line in out + errors) == Counter(line["custom_id"] for line in lines)
    for line in errors:
        response = line["response"]
        assert response["status_code"] == 429 and response["body"]["error"]["code"] == "insufficient_quota", line
    rows = _ledger(srv, key.name, {line["id"] for line in out})
    spent = sum(r["prompt_tokens"] + r["completion_tokens"] for r in rows)
    assert spent <= budget, f"spent {spent} of a budget of {budget}"


def test_cancelling_halfway_keeps_the_finished_lines_and_bills_only_them():
    model = _models()[0]
    name = _model_name(model)
    prices = ("--price", f"{name}={PRICE[0]},{PRICE[1]}", "--price", f"{name}@batch=300,700")
    with serving(model, ("--admin-token", ADMIN_TOKEN, "--batch-concurrency", "1", *prices),
                 ("--ctx-size", "1024", "--parallel", "1")) as (srv, _):
        key = _key(srv)
        n = 40
        lines = [_chat_line(srv.model_id, f"c{i:02d}", max_tokens=16, content=COUNT) for i in range(n)]
        batch = _submit(key.client, lines)
        _wait(srv, key.client, batch.id, _completed_at_least(2), "two completed lines")
        cancelling = key.client.batches.cancel(batch.id)
        assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at is not None, cancelling.to_dict()
        done = _wait(srv, key.client, batch.id)
        assert done.status == "cancelled", done.to_dict()
        assert done.cancelled_at is not None and done.cancelling_at <= done.cancelled_at, done.to_dict()
        assert done.completed_at is None, done.to_dict()

        out = _ended_halfway(key.client, done, lines, 16, "batch_cancelled")

        # Exactly the answered lines are billed, once each; the cancelled ones are not.
        rows = _ledger(srv, key.name, {line["id"] for line in out})
        assert Counter(r["request_id"] for r in rows) == Counter(line["id"] for line in out), rows
        _check_batch_rows(rows, done.id, (300, 700))


def test_an_expired_batch_delivers_and_bills_only_what_finished(tmp_path):
    """The 24-hour window cannot pass in a test: the batch's expiry is moved into the past in its
    database, as time would. What ran is delivered and billed once; the rest is `batch_expired`."""
    model = _models()[0]
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    extra = ("--admin-token", ADMIN_TOKEN, "--data-dir", str(data_dir), "--batch-concurrency", "1")
    with serving(model, extra, ("--ctx-size", "1024", "--parallel", "1")) as (srv, _):
        key = _key(srv)
        n = 40
        lines = [_chat_line(srv.model_id, f"e{i:02d}", max_tokens=16, content=COUNT) for i in range(n)]
        batch = _submit(key.client, lines)
        _wait(srv, key.client, batch.id, _completed_at_least(2), "two completed lines")
        with sqlite3.connect(data_dir / "gantry.db", timeout=30) as db:
            db.execute("UPDATE batches SET expires_at = ? WHERE id = ?", (int(time.time()) - 1, batch.id))
        done = _wait(srv, key.client, batch.id)
        assert done.status == "expired", done.to_dict()
        assert done.expired_at is not None and done.finalizing_at <= done.expired_at, done.to_dict()
        assert done.completed_at is None and done.cancelled_at is None, done.to_dict()

        out = _ended_halfway(key.client, done, lines, 16, "batch_expired")
        # Exactly the delivered lines are billed, once each (the line running at expiry included).
        rows = _ledger(srv, key.name, {line["id"] for line in out})
        assert Counter(r["request_id"] for r in rows) == Counter(line["id"] for line in out), rows
        time.sleep(1)
        billed = _ledger(srv, key.name, set())
        assert {r["request_id"] for r in billed if r.get("batch_id") == batch.id} == {line["id"] for line in out}, \
            "nothing of the batch billed beyond its output"


def test_a_batch_survives_kill_9_each_line_answered_and_billed_once(tmp_path):
    model = _models()[0]
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    # Both processes on one data directory; the dead one's claimed lines are retaken after 3 s.
    extra = ("--admin-token", ADMIN_TOKEN, "--data-dir", str(data_dir), "--heartbeat-timeout", "3", "--batch-concurrency", "2")
    settings = ("--ctx-size", "1024", "--parallel", "2")
    n = 30
    started = []
    try:
        first, tmp = _start(model, extra, settings)
        started.append((first, tmp))
        key = _key(first)
        lines = [_chat_line(first.model_id, f"k{i:02d}", max_tokens=12, content=COUNT) for i in range(n)]
        batch = _submit(key.client, lines)
        _wait(first, key.client, batch.id, _completed_at_least(3), "three completed lines")
        first.proc.kill()  # SIGKILL: nothing is drained or flushed
        first.proc.wait(timeout=60)

        second, tmp = _start(model, extra, settings)
        started.append((second, tmp))
        client = _client(second, key.secret)
        resumed = client.batches.retrieve(batch.id)
        assert resumed.status != "completed" and resumed.request_counts.completed < n, \
            f"the batch finished before the kill: the test proves nothing: {resumed.to_dict()}"
        done = _wait(second, client, batch.id)
        assert done.status == "completed", done.to_dict()
        assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (n, n, 0), done.to_dict()
        out = _read(client, done.output_file_id)
        assert Counter(line["custom_id"] for line in out) == Counter(line["custom_id"] for line in lines), \
            "every line answered exactly once"
        assert _read(client, done.error_file_id) == []
        for line in out:
            assert line["response"]["status_code"] == 200, line
            assert line["response"]["body"]["usage"]["completion_tokens"] == 12, line
        ids = [line["id"] for line in out]
        assert len(set(ids)) == n
        rows = _ledger(second, key.name, set(ids))
        assert Counter(r["request_id"] for r in rows) == Counter(ids), "every line billed exactly once"
        assert all(r["service_tier"] == "batch" and r.get("batch_id") == batch.id for r in rows), rows
    finally:
        for s, t in started:
            _stop(s.proc)
            shutil.rmtree(t.name, ignore_errors=True)


def _preempted(srv) -> float:
    """Batch lines the engine stopped for interactive work so far (`gantry_requests_total`)."""
    text = httpx.get(f"{srv.root_url}/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("gantry_requests_total{") and 'outcome="preempted"' in line)


def test_an_interactive_request_preempts_a_batch_line_which_runs_again_billed_once():
    with serving(_models()[0], ("--admin-token", ADMIN_TOKEN, "--batch-concurrency", "1"),
                 ("--ctx-size", "1024", "--parallel", "1")) as (srv, _):
        owner, other = _key(srv), _key(srv)
        n = 6
        lines = [_chat_line(srv.model_id, f"p{i}", max_tokens=64, content=COUNT) for i in range(n)]
        batch = _submit(owner.client, lines)
        _wait(srv, owner.client, batch.id, lambda b: b.status == "in_progress", "in_progress")
        # The one sequence holds a batch line nearly all the time; an interactive request takes it.
        for _ in range(5):
            answer = other.client.chat.completions.create(model=srv.model_id, messages=user(PROMPT), max_tokens=4,
                                                          temperature=0)
            assert answer.service_tier == "default" and answer.usage.completion_tokens >= 1, answer
            if _preempted(srv) >= 1:
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"no batch line was preempted by five interactive requests\n{srv.stderr_tail()}")

        done = _wait(srv, owner.client, batch.id)
        assert done.status == "completed" and done.request_counts.completed == n, done.to_dict()
        out = _read(owner.client, done.output_file_id)
        assert sorted(line["custom_id"] for line in out) == [f"p{i}" for i in range(n)], "each line once, run again"
        # The stopped run is billed nothing; the delivered one once, as its answer says.
        rows = _ledger(srv, owner.name, {line["id"] for line in out})
        assert len(rows) == n, rows
        told = {line["id"]: line["response"]["body"]["usage"] for line in out}
        for r in rows:
            assert (r["prompt_tokens"], r["completion_tokens"]) == \
                (told[r["request_id"]]["prompt_tokens"], told[r["request_id"]]["completion_tokens"]), (r, told)
