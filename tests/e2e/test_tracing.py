"""OpenTelemetry traces (docs/observability.md): a server started with the standard `OTEL_*`
variables exports one trace per API request over OTLP/HTTP (JSON here) to a receiver this module
runs. Each request's root span sits under the `traceparent` the client sent (or starts a trace
of its own), its phases are child spans in order, and its token counts are the ones the answer
reported. No prompt text and no API key reach a span."""

from __future__ import annotations

import json
import secrets
import shutil
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
import pytest

from _util import httpx
from conftest import _models, _start, _stop

# A word no span may carry: it is only in the prompts.
PROMPT_MARKER = "zanzibarquokka"
ENGINE_PHASES = ["queue", "prefill", "decode", "settle"]
SERVER_KIND = 2  # OTLP's SPAN_KIND_SERVER


class Receiver:
    """An OTLP/HTTP JSON trace receiver: keeps every span posted to /v1/traces, flattened with
    its resource's attributes; other encodings' bodies are kept whole."""

    def __init__(self) -> None:
        self.spans: list[dict] = []
        self.bodies: list[tuple[str, bytes]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                content_type = self.headers.get("Content-Type", "")
                ok = self.path == "/v1/traces"
                if ok and content_type.startswith("application/json"):
                    receiver._keep(json.loads(body))
                elif ok:
                    with receiver.lock:
                        receiver.bodies.append((content_type, body))
                self.send_response(200 if ok else 415)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self.http.server_address[1]}"

    def _keep(self, export: dict) -> None:
        with self.lock:
            for resource_spans in export.get("resourceSpans", []):
                resource = _attributes(resource_spans.get("resource", {}))
                for scope_spans in resource_spans.get("scopeSpans", []):
                    for span in scope_spans.get("spans", []):
                        self.spans.append({**span, "resource": resource, "attrs": _attributes(span)})

    def trace(self, trace_id: str, root_name: str = "POST /v1/chat/completions", timeout: float = 30) -> list[dict]:
        """The spans of `trace_id`, once its root (which ends last) has arrived."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                spans = [s for s in self.spans if s["traceId"].lower() == trace_id]
            if any(s["name"] == root_name for s in spans):
                time.sleep(0.3)  # anything exported in a later batch than the root
                with self.lock:
                    return [s for s in self.spans if s["traceId"].lower() == trace_id]
            time.sleep(0.05)
        pytest.fail(f"no `{root_name}` span of trace {trace_id} in {timeout}s; received {len(self.spans)} spans")

    def root_with(self, key: str, value, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                found = [s for s in self.spans if s["attrs"].get(key) == value and s["kind"] == SERVER_KIND]
            if found:
                assert len(found) == 1, found
                return found[0]
            time.sleep(0.05)
        pytest.fail(f"no root span with {key}={value!r} in {timeout}s")


def _value(v: dict):
    if "intValue" in v:
        return int(v["intValue"])  # JSON carries 64-bit integers as strings
    for kind in ("stringValue", "boolValue", "doubleValue"):
        if kind in v:
            return v[kind]
    return v


def _attributes(holder: dict) -> dict:
    return {a["key"]: _value(a.get("value", {})) for a in holder.get("attributes", [])}


@pytest.fixture(scope="module")
def receiver():
    r = Receiver()
    yield r
    r.http.shutdown()


@pytest.fixture(scope="module")
def srv(receiver):
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json",
        "OTEL_SERVICE_NAME": "gantry-e2e",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    server, tmp = _start(_models()[0], extra_env=env)
    try:
        yield server
    finally:
        _stop(server.proc)
        shutil.rmtree(tmp.name, ignore_errors=True)


@pytest.fixture(scope="module")
def client(srv):
    c = openai.OpenAI(base_url=srv.base_url, api_key=srv.api_key, max_retries=0, timeout=300)
    yield c
    c.close()


def _traceparent() -> tuple[str, str, str]:
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, parent_id, f"00-{trace_id}-{parent_id}-01"


def _messages(text: str) -> list[dict]:
    return [{"role": "user", "content": f"{text} ({PROMPT_MARKER})"}]


def _check_one_request(spans: list[dict], parent_id: str, usage, srv) -> dict:
    """One root under `parent_id`, every other span its child, the phases in order, the counts
    the answer reported; returns the root."""
    roots = [s for s in spans if s.get("parentSpanId", "").lower() == parent_id]
    assert len(roots) == 1, [(s["name"], s.get("parentSpanId")) for s in spans]
    root = roots[0]
    assert root["name"] == "POST /v1/chat/completions" and root["kind"] == SERVER_KIND
    assert root["resource"]["service.name"] == "gantry-e2e"
    children = {s["name"]: s for s in spans if s is not root}
    assert len(children) == len(spans) - 1, "one span per phase"
    assert all(s["parentSpanId"].lower() == root["spanId"].lower() for s in children.values())
    assert {"authenticate", "pre_admission", "prepare", "admission", *ENGINE_PHASES} <= set(children), children.keys()

    times = {name: (int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"])) for name, s in children.items()}
    root_start, root_end = int(root["startTimeUnixNano"]), int(root["endTimeUnixNano"])
    assert all(root_start <= start <= end <= root_end for start, end in times.values()), (root, times)
    for earlier, later in zip(ENGINE_PHASES, ENGINE_PHASES[1:]):
        assert times[earlier][1] <= times[later][0], (earlier, later, times)
    assert times["admission"][1] <= times["queue"][0]

    attrs = root["attrs"]
    assert attrs["http.response.status_code"] == 200
    assert attrs["gen_ai.request.model"] == srv.model_id
    assert attrs["gantry.service_tier"] == "default"
    assert attrs["gen_ai.usage.input_tokens"] == usage.prompt_tokens
    assert attrs["gen_ai.usage.output_tokens"] == usage.completion_tokens
    assert attrs["gen_ai.usage.cache_read.input_tokens"] == usage.prompt_tokens_details.cached_tokens
    assert children["prefill"]["attrs"]["gen_ai.usage.cache_read.input_tokens"] == attrs[
        "gen_ai.usage.cache_read.input_tokens"]
    recorded = json.dumps(spans)
    assert PROMPT_MARKER not in recorded and srv.api_key not in recorded
    return root


def test_a_chat_completion_is_one_trace_under_the_given_traceparent(srv, client, receiver):
    trace_id, parent_id, traceparent = _traceparent()
    resp = client.chat.completions.create(
        model=srv.model_id, messages=_messages("Say hello."), max_tokens=8, temperature=0,
        extra_headers={"traceparent": traceparent},
    )
    assert resp.usage.completion_tokens > 0
    root = _check_one_request(receiver.trace(trace_id), parent_id, resp.usage, srv)
    assert root["attrs"]["gantry.request_id"] == resp.id.removeprefix("chatcmpl-")


def test_a_stream_is_traced_to_its_end(srv, client, receiver):
    trace_id, parent_id, traceparent = _traceparent()
    stream = client.chat.completions.create(
        model=srv.model_id, messages=_messages("Count to five."), max_tokens=16, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_headers={"traceparent": traceparent},
    )
    usage = None
    for chunk in stream:
        usage = chunk.usage or usage
        last_chunk_at = time.time_ns()
    assert usage is not None and usage.completion_tokens > 0
    spans = receiver.trace(trace_id)
    root = _check_one_request(spans, parent_id, usage, srv)
    settle = next(s for s in spans if s["name"] == "settle")
    # The root ends with the stream's body, after the usage chunk (the settlement) was sent,
    # not when the response's headers left.
    assert int(root["endTimeUnixNano"]) >= int(settle["endTimeUnixNano"])
    first_token = next(int(s["endTimeUnixNano"]) for s in spans if s["name"] == "prefill")
    assert int(root["endTimeUnixNano"]) > first_token
    assert int(root["endTimeUnixNano"]) <= last_chunk_at + 1_000_000_000


def test_a_request_without_traceparent_starts_its_own_trace(srv, client, receiver):
    resp = client.chat.completions.create(
        model=srv.model_id, messages=_messages("Say yes."), max_tokens=4, temperature=0,
    )
    root = receiver.root_with("gantry.request_id", resp.id.removeprefix("chatcmpl-"))
    assert not root.get("parentSpanId"), "a new trace's root has no parent"
    spans = receiver.trace(root["traceId"].lower())
    assert sum(1 for s in spans if s["kind"] == SERVER_KIND) == 1
    assert {s["name"] for s in spans} >= {"authenticate", *ENGINE_PHASES}


def test_a_refused_key_is_traced_without_engine_phases(srv, receiver):
    trace_id, parent_id, traceparent = _traceparent()
    r = httpx.post(
        f"{srv.base_url}/chat/completions",
        json={"model": srv.model_id, "messages": _messages("hi")},
        headers={"Authorization": "Bearer sk-gantry-not-a-real-key-0123456789abcdef", "traceparent": traceparent},
        timeout=60,
    )
    assert r.status_code == 401
    spans = receiver.trace(trace_id)
    root = next(s for s in spans if s.get("parentSpanId", "").lower() == parent_id)
    assert root["attrs"]["http.response.status_code"] == 401
    error = r.json()["error"]
    assert root["attrs"]["error.type"] == (error.get("code") or error["type"])
    assert [s["name"] for s in spans if s is not root] == ["authenticate"]
    assert "not-a-real-key" not in json.dumps(spans)


def test_protobuf_by_default_and_nothing_lost_at_shutdown(receiver):
    """The default encoding (`http/protobuf`), with a batch delay longer than the test: the
    request's spans leave only because the server exports what it holds when it stops."""
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{receiver.endpoint}/v1/traces", "OTEL_BSP_SCHEDULE_DELAY": "600000"}
    server, tmp = _start(_models()[0], extra_env=env)
    trace_id, _, traceparent = _traceparent()
    try:
        r = httpx.post(
            f"{server.base_url}/chat/completions",
            json={"model": server.model_id, "messages": _messages("Say hi."), "max_tokens": 4},
            headers={"Authorization": f"Bearer {server.api_key}", "traceparent": traceparent},
            timeout=300,
        )
        assert r.status_code == 200
        time.sleep(0.5)
        with receiver.lock:
            assert not any(bytes.fromhex(trace_id) in body for _, body in receiver.bodies), "exported before the delay"
    finally:
        assert _stop(server.proc) == 0
        shutil.rmtree(tmp.name, ignore_errors=True)
    with receiver.lock:
        # A protobuf span carries its trace id as 16 raw bytes, and its name as it is.
        ours = [(kind, body) for kind, body in receiver.bodies if bytes.fromhex(trace_id) in body]
    assert len(ours) == 1 and ours[0][0] == "application/x-protobuf", [kind for kind, _ in ours]
    body = ours[0][1]
    for name in [b"POST /v1/chat/completions", b"authenticate", b"admission", *(p.encode() for p in ENGINE_PHASES)]:
        assert name in body, name
    assert PROMPT_MARKER.encode() not in body
