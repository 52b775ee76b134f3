"""Anthropic's Messages API through the `anthropic` SDK and LangChain's ChatAnthropic: the same
key, engine and ledger as Chat Completions. The anthropic SDK 2.x has no `temperature` argument
any more; it travels in `extra_body`."""

from __future__ import annotations

import json
import time
import uuid

import anthropic
import pytest

from _util import ledger_rows

WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.root_url, api_key=server.api_key, max_retries=0)


def _ledger_row(server, request_id):
    rows = ledger_rows(server, request_id)
    assert len(rows) == 1, rows
    return rows[0]


def test_a_message_answers_with_text_usage_and_a_ledger_row_that_matches(claude, server):
    request_id = f"an-{uuid.uuid4()}"
    r = claude.messages.create(
        model=server.model_id, max_tokens=24, system="Answer in one short sentence.",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        extra_body={"temperature": 0}, extra_headers={"x-request-id": request_id},
    )
    assert r.type == "message" and r.role == "assistant"
    assert r.content and r.content[0].type == "text" and r.content[0].text.strip()
    assert r.stop_reason in ("end_turn", "max_tokens")
    row = _ledger_row(server, request_id)
    assert row["completion_tokens"] == r.usage.output_tokens
    assert row["prompt_tokens"] == r.usage.input_tokens + r.usage.cache_read_input_tokens
    assert row["cached_tokens"] == r.usage.cache_read_input_tokens


def test_a_stop_sequence_is_named_in_the_answer(claude, server):
    r = claude.messages.create(
        model=server.model_id, max_tokens=40, extra_body={"temperature": 0},
        messages=[{"role": "user", "content": "Count from 1 to 10, separated by commas."}],
        stop_sequences=["zebra", "5"],
    )
    assert r.stop_reason == "stop_sequence", r
    assert r.stop_sequence == "5"
    assert "5" not in r.content[0].text


def test_a_stream_gives_the_same_text_and_usage_as_the_sdk_accumulates(claude, server):
    kw = dict(model=server.model_id, max_tokens=20, extra_body={"temperature": 0},
              messages=[{"role": "user", "content": "Say hello in French."}])
    whole = claude.messages.create(**kw)
    with claude.messages.stream(**kw) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text == final.content[0].text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == (
        whole.usage.input_tokens + whole.usage.cache_read_input_tokens
    )


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_tool_comes_back_as_tool_use_and_its_result_is_accepted(claude, server, stream):
    kw = dict(model=server.model_id, max_tokens=60, tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"},
              messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    if stream:
        with claude.messages.stream(**kw) as s:
            r = s.get_final_message()
    else:
        r = claude.messages.create(**kw)
    assert r.stop_reason == "tool_use", r
    call = next(b for b in r.content if b.type == "tool_use")
    assert call.id.startswith("toolu_"), call.id
    assert call.name == "get_weather" and isinstance(call.input, dict) and "city" in call.input
    follow = claude.messages.create(
        model=server.model_id, max_tokens=40, tools=[WEATHER],
        messages=kw["messages"] + [
            {"role": "assistant", "content": r.content},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "18C and sunny"}]},
        ],
    )
    assert follow.stop_reason in ("end_turn", "tool_use", "max_tokens")
    assert follow.usage.input_tokens + follow.usage.cache_read_input_tokens > r.usage.input_tokens


def test_output_config_format_makes_the_answer_valid_json(claude, server):
    schema = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 20}},
              "required": ["capital"], "additionalProperties": False}
    r = claude.messages.create(
        model=server.model_id, max_tokens=40,
        messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}],
        output_config={"format": {"type": "json_schema", "schema": schema}}, extra_body={"temperature": 0},
    )
    assert r.stop_reason == "end_turn", r
    assert set(json.loads(r.content[0].text)) == {"capital"}


def test_count_tokens_counts_what_a_message_would_read(claude, server):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    counted = claude.messages.count_tokens(model=server.model_id, messages=messages)
    r = claude.messages.create(model=server.model_id, max_tokens=1, messages=messages)
    assert counted.input_tokens == r.usage.input_tokens + r.usage.cache_read_input_tokens
    with_tools = claude.messages.count_tokens(model=server.model_id, messages=messages, tools=[WEATHER])
    assert with_tools.input_tokens > counted.input_tokens


def test_errors_are_anthropic_errors(claude, server):
    with pytest.raises(anthropic.NotFoundError) as e:
        claude.messages.create(model="no-such-model", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert e.value.body["error"]["type"] == "not_found_error"
    stranger = anthropic.Anthropic(base_url=server.root_url, api_key="sk-gantry-not-a-key-00000000000000", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        stranger.messages.create(model=server.model_id, max_tokens=5, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model=server.model_id, max_tokens=5, messages=[{"role": "user", "content": "x"}],
                               thinking={"type": "enabled", "budget_tokens": 1024})
    assert "thinking" in e.value.body["error"]["message"]


def test_langchain_chat_anthropic_talks_to_gantry(server):
    from langchain_anthropic import ChatAnthropic

    llm = ChatAnthropic(model=server.model_id, base_url=server.root_url, api_key=server.api_key,
                        max_tokens=24, temperature=0, max_retries=0)
    reply = llm.invoke("What is 2 + 2? Answer with the number.")
    assert "4" in reply.content
    assert reply.usage_metadata["output_tokens"] > 0
    chunks = list(llm.stream("Say hello."))
    assert "".join(c.content if isinstance(c.content, str) else "" for c in chunks).strip()


def _row_eventually(server, request_id):
    deadline = time.monotonic() + 60
    rows = ledger_rows(server, request_id)
    while not rows and time.monotonic() < deadline:
        time.sleep(0.2)
        rows = ledger_rows(server, request_id)
    assert len(rows) == 1, rows
    return rows[0]


def test_a_stream_the_client_leaves_is_cancelled_and_billed_as_chat_is(claude, client, server):
    """Cancellation billing is the chat path's: a Messages stream and a Responses stream closed
    after a few events are cancelled early and booked with what was generated."""
    anthropic_id, responses_id = f"an-cut-{uuid.uuid4().hex[:8]}", f"rs-cut-{uuid.uuid4().hex[:8]}"
    prompt = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
    with claude.messages.stream(model=server.model_id, max_tokens=300, messages=prompt,
                                extra_headers={"x-request-id": anthropic_id}) as s:
        for n, _ in enumerate(s.text_stream):
            if n == 3:
                break
    stream = client.responses.create(model=server.model_id, input=prompt[0]["content"], max_output_tokens=300,
                                     stream=True, store=False, extra_headers={"x-request-id": responses_id})
    for n, _ in enumerate(stream):
        if n == 6:
            break
    stream.close()
    for request_id in (anthropic_id, responses_id):
        row = _row_eventually(server, request_id)
        assert row["outcome"] == "cancelled", row
        assert 2 <= row["completion_tokens"] < 300, row


def test_a_prefill_is_continued_and_left_out_of_the_answer(claude, client, server):
    question = {"role": "user", "content": "What is the capital of France?"}
    r = claude.messages.create(model=server.model_id, max_tokens=20, extra_body={"temperature": 0},
                               messages=[question, {"role": "assistant", "content": '{"capital": "'}])
    text = r.content[0].text
    assert "Paris" in text and not text.startswith('{"capital"'), text
    # The same on Chat Completions, with DeepSeek's and Mistral's `prefix` mark.
    chat = client.chat.completions.create(
        model=server.model_id, max_tokens=20, temperature=0,
        messages=[question, {"role": "assistant", "content": '{"capital": "', "prefix": True}],
    )
    assert chat.choices[0].message.content == text
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model=server.model_id, max_tokens=5,
                               messages=[question, {"role": "assistant", "content": "Sure, "}])
