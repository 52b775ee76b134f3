"""Errors: mapped to the SDK's exception classes, and OpenAI's JSON error shape over raw HTTP."""

from __future__ import annotations

import openai
import pytest

from _util import error_body, user

WRONG_KEY = "sk-gantry-e2e-wrong-key-0123456789abcdef"


# ---------------------------------------------------------------------------------------------
# Through the SDK
# ---------------------------------------------------------------------------------------------


def test_wrong_key_is_authentication_error(server):
    bad = openai.OpenAI(base_url=server.base_url, api_key=WRONG_KEY, max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError) as ei:
        bad.chat.completions.create(model=server.model_id, messages=user("hi"), max_tokens=1)
    e = ei.value
    assert e.status_code == 401
    assert e.code == "invalid_api_key"
    assert "0123456789abcdef" not in e.message, "the presented key must not be echoed in full"
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    bad.close()


def test_unknown_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as ei:
        client.chat.completions.create(model="no-such-model", messages=user("hi"), max_tokens=1)
    assert ei.value.status_code == 404
    assert ei.value.code == "model_not_found"


def test_temperature_out_of_range(client, server):
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model=server.model_id, messages=user("hi"), max_tokens=1, temperature=3)
    assert ei.value.status_code == 400
    assert ei.value.param == "temperature"
    assert ei.value.type == "invalid_request_error"


def test_n_beyond_parallel_is_a_400_not_retried(client, server):
    # The server runs with --parallel 8. A 500 here made the SDK send the request three times.
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model=server.model_id, messages=user("hi"), max_tokens=1, n=9)
    assert ei.value.status_code == 400
    assert ei.value.param == "n"
    assert ei.value.type == "invalid_request_error"


def test_stream_options_without_stream(client, server):
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(
            model=server.model_id, messages=user("hi"), max_tokens=1, stream_options={"include_usage": True}
        )
    assert ei.value.status_code == 400
    assert ei.value.param == "stream_options"


def test_empty_messages(client, server):
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model=server.model_id, messages=[], max_tokens=1)
    assert ei.value.status_code == 400
    assert ei.value.param == "messages"


def test_prompt_longer_than_context(client, server):
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model=server.model_id, messages=user("hello " * 3000), max_tokens=8)
    assert ei.value.status_code == 400
    assert ei.value.code == "context_length_exceeded"
    assert "2048" in ei.value.message, ei.value.message


def test_prompt_longer_than_context_without_max_tokens(client, server):
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model=server.model_id, messages=user("hello " * 3000))
    assert ei.value.code == "context_length_exceeded"


@pytest.mark.parametrize("param", ["max_tokens", "max_completion_tokens"])
def test_zero_max_tokens(client, server, param):
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model=server.model_id, messages=user("hi"), **{param: 0})
    assert ei.value.status_code == 400
    assert ei.value.param == param


def test_server_still_healthy_after_errors(client, server):
    r = client.chat.completions.create(model=server.model_id, messages=user("Say hi."), max_tokens=2, temperature=0)
    assert r.choices[0].message.content


# ---------------------------------------------------------------------------------------------
# Raw HTTP
# ---------------------------------------------------------------------------------------------


def test_health_needs_no_auth(http):
    r = http.get("/health")
    assert r.status_code == 200
    assert r.headers.get("x-request-id")


def test_malformed_json(http, auth):
    r = http.post(
        "/v1/chat/completions",
        content=b'{"model": "x", "messages": [',
        headers={**auth, "Content-Type": "application/json"},
    )
    assert r.status_code == 400
    err = error_body(r)
    assert err["type"] == "invalid_request_error"


def test_missing_authorization(http, server):
    r = http.post("/v1/chat/completions", json={"model": server.model_id, "messages": user("hi")})
    assert r.status_code == 401
    assert error_body(r)["code"] == "invalid_api_key"
    r = http.get("/v1/models")
    assert r.status_code == 401
    assert error_body(r)["code"] == "invalid_api_key"


def test_unknown_route(http, auth):
    r = http.get("/v1/nope", headers=auth)
    assert r.status_code == 404
    error_body(r)


def test_wrong_method(http, auth):
    r = http.delete("/v1/chat/completions", headers=auth)
    assert r.status_code == 405
    error_body(r)


def test_oversized_body(http, auth, server):
    filler = "a" * (5 * 1024 * 1024)
    body = ('{"model": "%s", "messages": [{"role": "user", "content": "%s"}]}' % (server.model_id, filler)).encode()
    r = http.post("/v1/chat/completions", content=body, headers={**auth, "Content-Type": "application/json"})
    assert r.status_code == 413
    # The body was left unread: the client must be told the connection closes, or it reuses it.
    assert r.headers.get("connection") == "close", dict(r.headers)
    error_body(r)


def test_text_plain_content_type(http, auth, server):
    body = '{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}' % server.model_id
    r = http.post("/v1/chat/completions", content=body.encode(), headers={**auth, "Content-Type": "text/plain"})
    assert r.status_code == 400
    assert error_body(r)["type"] == "invalid_request_error"


def test_every_response_has_request_id(http, auth, server):
    ok_chat = {"model": server.model_id, "messages": user("hi"), "max_tokens": 1}
    responses = [
        http.get("/health"),
        http.get("/v1/models", headers=auth),
        http.get(f"/v1/models/{server.model_id}", headers=auth),
        http.post("/v1/chat/completions", json=ok_chat, headers=auth),
        http.post("/v1/chat/completions", json=ok_chat),  # 401
        http.post("/v1/chat/completions", json={**ok_chat, "temperature": 3}, headers=auth),  # 400
        http.get("/v1/nope", headers=auth),  # 404
        http.delete("/v1/chat/completions", headers=auth),  # 405
    ]
    expected = [200, 200, 200, 200, 401, 400, 404, 405]
    assert [r.status_code for r in responses] == expected
    ids = [r.headers.get("x-request-id") for r in responses]
    assert all(ids), list(zip(expected, ids))
    assert len(set(ids)) == len(ids), f"request ids repeat: {ids}"
