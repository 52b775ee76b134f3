"""A reasoning model through every client: a tiny random-weight model with a thinking template
(`tiny-gguf --reasoning`: `<think>`/`</think>` tokens, Qwen3's `enable_thinking` switch). Its
words are noise; what is checked is where they go. The thinking comes back apart from the answer
(`reasoning_content` and `reasoning` in Chat Completions, a `thinking` block in Messages, a
`reasoning` item in Responses), streamed and not, ends on its budget with the answer after it,
is counted exactly in `reasoning_tokens`, and the ledger books what each client was told."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import anthropic
import openai
import pytest

from _util import gantry_bin, httpx, ledger_rows
from conftest import _start, _stop


@pytest.fixture(scope="module")
def thinker():
    tiny = Path(gantry_bin()).with_name("tiny-gguf")
    if not tiny.exists():
        pytest.fail(f"{tiny} not found: `make test` builds it (cargo build --workspace)")
    work = tempfile.mkdtemp(prefix="gantry-reasoning-")
    model = f"{work}/thinker.gguf"
    subprocess.run([str(tiny), model, "--reasoning"], check=True)
    # Greedy answers compared across requests (streamed and not, cached prefix or not) must not
    # depend on the batch: a random model's logits are full of near-ties.
    srv, tmp = _start(model, ("--parallel", "2", "--deterministic-greedy"), settings=("--ctx-size", "4096"))
    try:
        yield srv
    finally:
        _stop(srv.proc)
        shutil.rmtree(tmp.name, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def client(thinker):
    c = openai.OpenAI(base_url=thinker.base_url, api_key=thinker.api_key, max_retries=0, timeout=120)
    yield c
    c.close()


def _last_tokens_banned(server, count: int) -> dict:
    """A logit bias against the vocabulary's last `count` tokens (where tiny-gguf puts the tokens
    that end a generation), read from the 400 an out-of-range id gets: it keeps a random model
    from ending early."""
    r = httpx.post(
        f"{server.base_url}/chat/completions",
        json={"model": server.model_id, "messages": [{"role": "user", "content": "x"}], "logit_bias": {"100000": 1}},
        headers={"Authorization": f"Bearer {server.api_key}"},
        timeout=60,
    )
    assert r.status_code == 400, r.text
    n_vocab = int(re.search(r"\(0\.\.(\d+)\)", r.json()["error"]["message"]).group(1))
    return {str(n_vocab - k): -100 for k in range(1, count + 1)}


@pytest.fixture(scope="module")
def no_end(thinker):
    return _last_tokens_banned(thinker, 1)


def _row(server, request_id):
    rows = ledger_rows(server, request_id)
    assert len(rows) == 1, rows
    return rows[0]


ASK = [{"role": "user", "content": "What is 2 + 2?"}]


def test_thinking_comes_apart_ends_on_its_budget_and_is_billed(thinker, client, no_end):
    request_id = f"rz-{uuid.uuid4()}"
    r = client.chat.completions.create(
        model=thinker.model_id, messages=ASK, max_tokens=60, temperature=0, logit_bias=no_end,
        extra_body={"thinking_token_budget": 20}, extra_headers={"x-request-id": request_id},
    )
    message = r.choices[0].message
    thinking = message.model_extra["reasoning_content"]
    assert thinking and message.model_extra["reasoning"] == thinking
    assert message.content, "the answer follows the thinking"
    for text in (thinking, message.content):
        assert "<think>" not in text and "</think>" not in text
    assert r.usage.completion_tokens_details.reasoning_tokens == 20, "the end marker is forced on the budget"
    assert r.usage.completion_tokens == 60 and r.choices[0].finish_reason == "length"
    row = _row(thinker, request_id)
    assert (row["completion_tokens"], row["reasoning_tokens"]) == (60, 20)

    # The same request streamed: the same thinking, then the same answer, and the same usage.
    stream = client.chat.completions.create(
        model=thinker.model_id, messages=ASK, max_tokens=60, temperature=0, logit_bias=no_end, stream=True,
        stream_options={"include_usage": True}, extra_body={"thinking_token_budget": 20},
    )
    streamed, answer, usage, order = "", "", None, []
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            extra = choice.delta.model_extra or {}
            if extra.get("reasoning_content"):
                assert extra["reasoning"] == extra["reasoning_content"]
                streamed += extra["reasoning_content"]
                order.append("thinking")
            if choice.delta.content:
                answer += choice.delta.content
                order.append("answer")
    assert (streamed, answer) == (thinking, message.content)
    assert order.index("answer") > max(i for i, o in enumerate(order) if o == "thinking"), "thinking first"
    assert usage.completion_tokens_details.reasoning_tokens == 20


def test_effort_none_turns_thinking_off_and_a_budget_leaves_room_to_answer(thinker, client, no_end):
    off = client.chat.completions.create(
        model=thinker.model_id, messages=ASK, max_tokens=20, temperature=0, logit_bias=no_end, reasoning_effort="none",
    )
    assert "reasoning_content" not in (off.choices[0].message.model_extra or {})
    assert off.usage.completion_tokens_details.reasoning_tokens == 0
    default = client.chat.completions.create(
        model=thinker.model_id, messages=ASK, max_tokens=40, temperature=0, logit_bias=no_end,
    )
    # The empty thinking block is in the prompt: `<think>`, "\n\n", `</think>`, "\n\n".
    assert off.usage.prompt_tokens == default.usage.prompt_tokens + 4
    # No budget asked: thinking still ends with a quarter of max_tokens left for the answer.
    assert default.usage.completion_tokens_details.reasoning_tokens == 30
    assert default.choices[0].message.content
    bad = httpx.post(
        f"{thinker.base_url}/chat/completions",
        json={"model": thinker.model_id, "messages": ASK, "reasoning_effort": "maximal"},
        headers={"Authorization": f"Bearer {thinker.api_key}"},
        timeout=60,
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reasoning_effort", bad.text


def test_a_response_format_shapes_the_answer_not_the_thinking(thinker, client, no_end):
    schema = {"type": "object", "properties": {"sum": {"type": "integer"}}, "required": ["sum"], "additionalProperties": False}
    r = client.chat.completions.create(
        model=thinker.model_id, messages=ASK, max_tokens=80, temperature=0, logit_bias=no_end,
        response_format={"type": "json_schema", "json_schema": {"name": "sum", "schema": schema}},
        extra_body={"thinking_token_budget": 12},
    )
    assert r.usage.completion_tokens_details.reasoning_tokens == 12
    assert not r.choices[0].message.model_extra["reasoning_content"].startswith("{")
    assert isinstance(json.loads(r.choices[0].message.content)["sum"], int), r.choices[0].message.content


def test_earlier_thinking_goes_to_the_template_which_drops_it(thinker, client):
    def prompt_tokens(extra: dict) -> int:
        history = [ASK[0], {"role": "assistant", "content": "4", **extra}, {"role": "user", "content": "And 3 + 3?"}]
        r = client.chat.completions.create(
            model=thinker.model_id, messages=history, max_tokens=1, reasoning_effort="none",
        )
        return r.usage.prompt_tokens

    plain = prompt_tokens({})
    assert prompt_tokens({"reasoning_content": "Two and two make four."}) == plain
    assert prompt_tokens({"reasoning": "Two and two make four."}) == plain


def test_anthropic_extended_thinking_is_a_thinking_block_streamed_and_not(thinker):
    claude = anthropic.Anthropic(base_url=thinker.root_url, api_key=thinker.api_key, max_retries=0)
    request_id = f"rz-{uuid.uuid4()}"
    kw = dict(
        model=thinker.model_id, max_tokens=1100, messages=ASK,
        thinking={"type": "enabled", "budget_tokens": 1024}, extra_body={"temperature": 0},
    )
    m = claude.messages.create(**kw, extra_headers={"x-request-id": request_id})
    kinds = [b.type for b in m.content]
    assert kinds[0] == "thinking" and m.content[0].thinking and m.content[0].signature, kinds
    row = _row(thinker, request_id)
    assert row["completion_tokens"] == m.usage.output_tokens
    assert 0 < row["reasoning_tokens"] <= 1024
    with claude.messages.stream(**kw) as stream:
        streamed = stream.get_final_message()
    assert [b.type for b in streamed.content] == kinds
    assert streamed.content[0].thinking == m.content[0].thinking
    assert streamed.content[0].signature == m.content[0].signature
    assert streamed.usage.output_tokens == m.usage.output_tokens
    # Without `thinking`, as at Anthropic, the model does not think.
    plain = claude.messages.create(model=thinker.model_id, max_tokens=16, messages=ASK)
    assert all(b.type != "thinking" for b in plain.content)
    with pytest.raises(anthropic.BadRequestError, match="budget_tokens"):
        claude.messages.create(**{**kw, "thinking": {"type": "enabled", "budget_tokens": 100}})


def test_responses_reasoning_is_an_item_with_reasoning_tokens(thinker, client):
    request_id = f"rz-{uuid.uuid4()}"
    r = client.responses.create(
        model=thinker.model_id, input="What is 2 + 2?", reasoning={"effort": "minimal"}, max_output_tokens=400,
        temperature=0, extra_headers={"x-request-id": request_id},
    )
    assert r.output[0].type == "reasoning" and r.output[0].content[0].type == "reasoning_text"
    thinking = r.output[0].content[0].text
    assert thinking
    details = r.usage.output_tokens_details.reasoning_tokens
    assert 0 < details <= 256, "minimal effort is a 256-token budget"
    row = _row(thinker, request_id)
    assert (row["completion_tokens"], row["reasoning_tokens"]) == (r.usage.output_tokens, details)
    kinds, final = [], None
    with client.responses.stream(
        model=thinker.model_id, input="What is 2 + 2?", reasoning={"effort": "minimal"}, max_output_tokens=400,
        temperature=0,
    ) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type in ("response.completed", "response.incomplete"):
                final = event.response  # the random model runs to max_output_tokens: incomplete
    assert final is not None and final.status == r.status, kinds[-3:]
    assert "response.reasoning_text.delta" in kinds
    assert final.output[0].content[0].text == thinking
    assert final.usage.output_tokens_details.reasoning_tokens == details
    # The stored response continues: its reasoning item goes back as the turn's thinking.
    follow = client.responses.create(
        model=thinker.model_id, previous_response_id=r.id, input="And 3 + 3?", max_output_tokens=8,
        reasoning={"effort": "none"},
    )
    assert follow.usage.output_tokens_details.reasoning_tokens == 0
    assert json.loads(follow.model_dump_json())["reasoning"]["effort"] == "none"


def test_a_harmony_model_thinks_on_analysis_and_answers_on_final():
    """gpt-oss's format (`tiny-gguf --harmony`): the analysis channel is the thinking, the final
    channel the answer, and no channel markup reaches the client."""
    tiny = Path(gantry_bin()).with_name("tiny-gguf")
    work = tempfile.mkdtemp(prefix="gantry-harmony-")
    subprocess.run([str(tiny), f"{work}/harmony.gguf", "--harmony"], check=True)
    srv, tmp = _start(f"{work}/harmony.gguf", ("--parallel", "1"), settings=("--ctx-size", "1024"))
    try:
        client = openai.OpenAI(base_url=srv.base_url, api_key=srv.api_key, max_retries=0, timeout=120)
        # `<|return|>`, `<|call|>` and ChatML's three come last.
        r = client.chat.completions.create(
            model=srv.model_id, messages=ASK, max_tokens=80, temperature=0, logit_bias=_last_tokens_banned(srv, 5),
            extra_body={"thinking_token_budget": 40},
        )
        message = r.choices[0].message
        assert r.usage.completion_tokens_details.reasoning_tokens == 40
        thinking = message.model_extra["reasoning_content"]
        assert thinking and message.content, message
        for text in (thinking, message.content):
            assert "<|" not in text and "analysis" not in text, text
        client.close()
    finally:
        _stop(srv.proc)
        shutil.rmtree(tmp.name, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
