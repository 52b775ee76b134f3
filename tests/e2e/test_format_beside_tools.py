"""`auto` tools beside a `response_format` (Chat Completions) or `text.format` (Responses), on
the default 0.5B and the 1.5B agent model: a format never turns an answer into a call. What the
model answers in text without the format comes back as the formatted answer with it, and a call
it makes without the format is still a call with it. (Messages has no response format.)"""

from __future__ import annotations

import json


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
# Answers in text on both models without a format; then the call that must stay a call.
ANSWERS = ["Spell the word cat.", "Name one colour."]
CALL = "What's the weather in Paris right now?"


def _chat(client, model, text, **extra):
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": text}], tools=TOOLS, temperature=0, max_tokens=60, **extra
    )
    return r.choices[0].message


def test_a_format_never_turns_an_answer_into_a_call(server, client):
    _answers_stay_answers(server, client)


def test_a_format_never_turns_an_answer_into_a_call_on_the_agent_model(agent_server, agent_client):
    _answers_stay_answers(agent_server, agent_client)


def test_a_call_stays_a_call_with_a_format(server, client):
    _calls_stay_calls(server, client)


def test_a_call_stays_a_call_with_a_format_on_the_agent_model(agent_server, agent_client):
    _calls_stay_calls(agent_server, agent_client)


def _answers_stay_answers(srv, client):
    compared = 0
    for text in ANSWERS:
        if _chat(client, srv.model_id, text).tool_calls:
            continue  # the model calls on its own here: the format need not stop it
        compared += 1
        formatted = _chat(client, srv.model_id, text, response_format=FORMAT)
        assert not formatted.tool_calls, f"{text!r} became a call: {formatted.tool_calls}"
        assert isinstance(json.loads(formatted.content)["answer"], str), formatted.content
        # The same through Responses' text.format.
        r = client.responses.create(
            model=srv.model_id, input=text, temperature=0, max_output_tokens=60,
            tools=[{"type": "function", **TOOLS[0]["function"]}],
            text={"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA, "strict": True}},
        )
        assert [item.type for item in r.output] == ["message"], r.output
        assert isinstance(json.loads(r.output_text)["answer"], str), r.output_text
    assert compared, "at least one prompt is answered in text without the format"


def _calls_stay_calls(srv, client):
    plain = _chat(client, srv.model_id, CALL)
    assert plain.tool_calls and plain.tool_calls[0].function.name == "get_weather", plain
    formatted = _chat(client, srv.model_id, CALL, response_format=FORMAT)
    assert formatted.tool_calls and formatted.tool_calls[0].function.name == "get_weather", formatted
    assert json.loads(formatted.tool_calls[0].function.arguments)["city"] == "Paris"
    # Streamed: the held output reaches the client once it is a call, as a call.
    stream = client.chat.completions.create(
        model=srv.model_id, messages=[{"role": "user", "content": CALL}], tools=TOOLS, temperature=0, max_tokens=60,
        response_format=FORMAT, stream=True,
    )
    names, content = [], ""
    for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            names += [c.function.name for c in choice.delta.tool_calls or [] if c.function and c.function.name]
    assert names == ["get_weather"] and not content.strip(), (names, content)
