"""OpenAI's Responses API through the openai SDK: `responses.create`, `responses.stream`,
`responses.parse`, a function-call turn, stored responses continued by `previous_response_id`
(each key its own), and what is refused."""

from __future__ import annotations

import subprocess
import uuid

import openai
import pytest
from pydantic import BaseModel

from _util import gantry_bin, ledger_rows

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False},
    "strict": True,
}


def test_a_response_answers_with_output_text_and_usage_the_ledger_books(client, server):
    request_id = f"rs-{uuid.uuid4()}"
    r = client.responses.create(
        model=server.model_id, input="What is the capital of France?", instructions="Answer in one sentence.",
        max_output_tokens=24, temperature=0, extra_headers={"x-request-id": request_id},
    )
    assert r.object == "response" and r.status in ("completed", "incomplete")
    assert r.output_text.strip()
    assert r.instructions == "Answer in one sentence."
    [row] = ledger_rows(server, request_id)
    assert row["prompt_tokens"] == r.usage.input_tokens
    assert row["cached_tokens"] == r.usage.input_tokens_details.cached_tokens
    assert row["completion_tokens"] == r.usage.output_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens


def test_a_stream_gives_the_same_text_and_usage(client, server):
    kw = dict(model=server.model_id, input="Say hello in French.", max_output_tokens=20, temperature=0)
    whole = client.responses.create(**kw)
    deltas = []
    with client.responses.stream(**kw) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == whole.output_text
    assert final.status == whole.status
    assert final.usage.output_tokens == whole.usage.output_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_function_call_and_its_output_make_a_turn(client, server, stream):
    kw = dict(model=server.model_id, input="What is the weather in Paris?", tools=[WEATHER], tool_choice="required")
    if stream:
        with client.responses.stream(**kw) as s:
            r = s.get_final_response()
    else:
        r = client.responses.create(**kw)
    [call] = [o for o in r.output if o.type == "function_call"]
    assert call.name == "get_weather" and call.call_id and call.arguments.startswith("{")
    follow = client.responses.create(
        model=server.model_id, tools=[WEATHER],
        input=[{"role": "user", "content": "What is the weather in Paris?"}, call.model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": call.call_id, "output": "18C and sunny"}],
    )
    assert follow.status in ("completed", "incomplete")
    assert follow.usage.input_tokens > r.usage.input_tokens


class Fruit(BaseModel):
    name: str
    color: str


def test_text_format_json_schema_parses(client, server):
    # Greedy: at the API's default temperature (1.0) the 0.5B model sometimes never closed a string
    # and ran to the token limit, which no schema can stop.
    r = client.responses.parse(model=server.model_id, input="Give me a fruit and its color.", text_format=Fruit,
                               temperature=0)
    assert isinstance(r.output_parsed, Fruit) and r.output_parsed.name


def _second_key(server) -> openai.OpenAI:
    out = subprocess.run([gantry_bin(), "keys", "create", "--name", f"other-{uuid.uuid4().hex[:8]}", "--data-dir", server.data_dir],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return openai.OpenAI(base_url=server.base_url, api_key=out.stdout.strip().splitlines()[-1], max_retries=0)


@pytest.mark.parametrize("stream", [False, True])
def test_a_stored_response_continues_a_conversation_for_its_key_alone(client, server, stream):
    kw = dict(model=server.model_id, input="My name is Ada. Reply with one word: OK.", max_output_tokens=8, temperature=0)
    if stream:
        with client.responses.stream(**kw) as s:
            first = s.get_final_response()
    else:
        first = client.responses.create(**kw)
    assert first.store is True
    assert client.responses.retrieve(first.id).output_text == first.output_text
    second = client.responses.create(model=server.model_id, input="What is my name?", previous_response_id=first.id,
                                     max_output_tokens=8, temperature=0)
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > first.usage.input_tokens + 5, "the first turn is in the prompt"
    listed = client.responses.input_items.list(second.id)
    assert [item.type for item in listed.data] == ["message"] and listed.data[0].content[0].text == "What is my name?"
    stranger = _second_key(server)
    with pytest.raises(openai.NotFoundError):
        stranger.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        stranger.responses.input_items.list(first.id)
    with pytest.raises(openai.BadRequestError) as e:
        stranger.responses.create(model=server.model_id, input="x", previous_response_id=first.id)
    assert e.value.body["param"] == "previous_response_id"
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=server.model_id, input="x", previous_response_id=second.id)


def test_what_a_stored_response_keeps_is_held_to_the_apis_limits(client, server):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=server.model_id, input="x", metadata={"k": "v" * 513}, max_output_tokens=1)
    assert e.value.body["param"] == "metadata.k"
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=server.model_id, input="x", max_output_tokens=1, extra_body={"truncation": "x" * 1000})
    assert e.value.body["param"] == "truncation"
    r = client.responses.create(model=server.model_id, input="Hi", metadata={"team": "a"}, max_output_tokens=2)
    assert r.metadata == {"team": "a"}
    assert r.usage.input_tokens_details.cache_write_tokens == 0
    ResponseUsage = openai.types.responses.ResponseUsage
    ResponseUsage.model_validate(r.usage.model_dump(), strict=True)


def test_fields_kept_beyond_openais_limits_are_refused_by_name(client, server):
    # 3.5 MB in `user` was billed 42 tokens and stored for 30 days.
    for field, value in [("user", "u" * 3_500_000), ("user", "u" * 65), ("safety_identifier", "s" * 65)]:
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model=server.model_id, input="x", max_output_tokens=1, extra_body={field: value})
        assert (e.value.body["param"], e.value.body["code"]) == (field, "string_above_max_length")
    r = client.responses.create(model=server.model_id, input="Hi", max_output_tokens=2, user="u" * 64,
                                safety_identifier="s" * 64)
    assert r.user == "u" * 64 and r.safety_identifier == "s" * 64


@pytest.mark.parametrize("stream", [False, True])
def test_included_logprobs_come_with_the_text(client, server, stream):
    kw = dict(model=server.model_id, input="Say hello.", max_output_tokens=40, temperature=0,
              include=["message.output_text.logprobs"], top_logprobs=2)
    if stream:
        with client.responses.stream(**kw) as s:
            r = s.get_final_response()
    else:
        r = client.responses.create(**kw)
    [part] = r.output[0].content
    assert part.logprobs and all(len(lp.top_logprobs) == 2 for lp in part.logprobs), part
    assert "".join(lp.token for lp in part.logprobs) == part.text


def test_unsupported_fields_are_refused_clearly(client, server):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=server.model_id, input="x", tools=[{"type": "web_search"}])
    assert "Built-in tools" in e.value.body["message"]
    unstored = client.responses.create(model=server.model_id, input="Hi", store=False, max_output_tokens=4)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
