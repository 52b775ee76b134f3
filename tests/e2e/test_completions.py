"""`POST /v1/completions` through the openai SDK's `completions.create` on the default model:
plain and streamed (with `include_usage`), `echo`, `logprobs` in the legacy shape, `n` over an
array prompt, fill-in-the-middle with `suffix`, OpenAI's 400s, and the ledger booking exactly
what the client was told. Gemma 3 270M, a base model without FIM tokens, completes plain prompts
and refuses a `suffix` with a 400 naming it. llama.cpp's `/infill` as llama.vim sends it."""

from __future__ import annotations

import ast
import json
import time
import uuid

import openai
import pytest

from _util import ledger_rows, sse_payloads
from conftest import _models, serving

BASE = "gemma-3-270m-q4_k_m"
PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"


def _booked(srv, request_id: str) -> tuple[int, int]:
    rows: list[dict] = []
    for _ in range(100):
        rows = ledger_rows(srv, request_id)
        if rows:
            break
        time.sleep(0.1)
    assert len(rows) == 1, rows
    return rows[0]["prompt_tokens"], rows[0]["completion_tokens"]


def test_a_plain_completion_is_booked_as_the_client_was_told(server, client):
    request_id = f"completions-{uuid.uuid4()}"
    reply = client.completions.create(
        model=server.model_id, prompt=PROMPT, max_tokens=12, temperature=0,
        extra_headers={"x-request-id": request_id},
    )
    assert reply.object == "text_completion" and reply.id.startswith("cmpl-"), reply
    [choice] = reply.choices
    assert choice.index == 0 and choice.text and choice.finish_reason in ("stop", "length"), choice
    assert choice.logprobs is None
    usage = reply.usage
    assert 1 <= usage.completion_tokens <= 12 and usage.prompt_tokens > 10, usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, usage
    assert usage.prompt_tokens_details.cached_tokens is not None, usage
    assert _booked(server, request_id) == (usage.prompt_tokens, usage.completion_tokens)


def test_max_tokens_defaults_to_openais_16(server, client):
    reply = client.completions.create(model=server.model_id, prompt="1, 2, 3, 4, 5,", temperature=0)
    assert reply.usage.completion_tokens == 16 and reply.choices[0].finish_reason == "length", reply


def test_a_stream_says_what_the_collected_answer_says_and_ends_with_usage(server, client):
    request_id = f"completions-stream-{uuid.uuid4()}"
    args = dict(model=server.model_id, prompt=PROMPT, max_tokens=12, temperature=0)
    whole = client.completions.create(**args)
    chunks = list(client.completions.create(
        **args, stream=True, stream_options={"include_usage": True}, extra_headers={"x-request-id": request_id},
    ))
    assert all(c.object == "text_completion" for c in chunks), chunks
    *text_chunks, last = chunks
    assert last.choices == [] and last.usage is not None, last
    assert "".join(c.choices[0].text for c in text_chunks if c.choices) == whole.choices[0].text
    reasons = [c.choices[0].finish_reason for c in text_chunks if c.choices and c.choices[0].finish_reason]
    assert reasons == [whole.choices[0].finish_reason], reasons
    assert last.usage.completion_tokens == whole.usage.completion_tokens, (last.usage, whole.usage)
    assert _booked(server, request_id) == (last.usage.prompt_tokens, last.usage.completion_tokens)


def test_echo_repeats_the_prompt_before_the_answer(server, client):
    plain = client.completions.create(model=server.model_id, prompt=PROMPT, max_tokens=6, temperature=0)
    echoed = client.completions.create(model=server.model_id, prompt=PROMPT, max_tokens=6, temperature=0, echo=True)
    assert echoed.choices[0].text == PROMPT + plain.choices[0].text, echoed.choices[0].text
    streamed = client.completions.create(
        model=server.model_id, prompt=PROMPT, max_tokens=6, temperature=0, echo=True, stream=True,
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == echoed.choices[0].text


def test_logprobs_come_in_the_legacy_shape_one_entry_per_billed_token(server, client):
    reply = client.completions.create(model=server.model_id, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=2)
    lp = reply.choices[0].logprobs
    n = reply.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n, lp
    assert all(v <= 0 for v in lp.token_logprobs), lp.token_logprobs
    assert all(1 <= len(top) <= 2 for top in lp.top_logprobs), lp.top_logprobs
    # Greedy: the sampled token is the likeliest alternative.
    assert all(max(top.values()) == pytest.approx(v, abs=1e-4) for top, v in zip(lp.top_logprobs, lp.token_logprobs))
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset), lp.text_offset
    if reply.choices[0].finish_reason == "length":
        assert "".join(lp.tokens) == reply.choices[0].text, (lp.tokens, reply.choices[0].text)


def test_n_choices_per_prompt_of_an_array_prompt(server, client):
    prompts = ["# Python\nimport", "// Rust\nfn main() {"]
    reply = client.completions.create(model=server.model_id, prompt=prompts, n=2, max_tokens=4, temperature=0.8, seed=3)
    assert sorted(c.index for c in reply.choices) == [0, 1, 2, 3], reply.choices
    singles = [client.completions.create(model=server.model_id, prompt=p, max_tokens=1) for p in prompts]
    assert reply.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles), reply.usage
    assert 4 <= reply.usage.completion_tokens <= 16, reply.usage
    # Greedy choices of one prompt agree (they decode in one batch), and choices 2 and 3 continue
    # the second prompt: echoed, each text starts with its own prompt. Compared with the second
    # prompt decoded alone, only the first token is held equal: four rows in a step sum in
    # another order than one, so a near tie later on may go the other way (docs/determinism.md).
    greedy = client.completions.create(model=server.model_id, prompt=prompts, n=2, max_tokens=4, temperature=0, echo=True)
    by_index = {c.index: c.text for c in greedy.choices}
    assert by_index[0] == by_index[1] and by_index[2] == by_index[3], by_index
    assert [by_index[i].startswith(prompts[i // 2]) for i in range(4)] == [True] * 4, by_index
    alone = client.completions.create(model=server.model_id, prompt=prompts[1], max_tokens=1, temperature=0)
    assert by_index[2].startswith(prompts[1] + alone.choices[0].text), (by_index, alone.choices[0].text)


def test_fill_in_the_middle_with_a_suffix(server, client):
    prefix = "def add(a, b):\n"
    suffix = "\n\nassert add(2, 3) == 5\n"
    reply = client.completions.create(model=server.model_id, prompt=prefix, suffix=suffix, max_tokens=48, temperature=0)
    middle = reply.choices[0].text
    assert "assert add" not in middle, middle
    exec(compile(prefix + middle + suffix, "<fim>", "exec"), {})
    assert reply.choices[0].finish_reason == "stop", reply


def test_bad_requests_are_openais_400s(server, client):
    cases = [
        (dict(logprobs=6), "logprobs"),
        (dict(best_of=3), "best_of"),
        (dict(extra_body={"response_format": {"type": "json_object"}}), "response_format"),
        (dict(extra_body={"tools": [{"type": "function", "function": {"name": "f"}}]}), "tools"),
        (dict(echo=True, logprobs=1), "echo"),
    ]
    for extra, param in cases:
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model=server.model_id, prompt="x", max_tokens=2, **extra)
        body = refused.value.body
        assert refused.value.status_code == 400 and body["param"] == param, (extra, body)
        assert body["type"] == "invalid_request_error" and body["message"], body
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=2)


def test_infill_as_llama_vim_sends_it(server, http, auth):
    body = {
        "input_prefix": "def is_even(n):\n", "input_suffix": "\n\nassert is_even(4) and not is_even(3)\n",
        "input_extra": [{"text": "def is_odd(n):\n    return n % 2 == 1\n", "time": 1, "filename": "odd.py"}],
        "prompt": "    return", "n_predict": 32, "n_indent": 4, "top_k": 40, "top_p": 0.99, "stream": False,
        "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "t_max_prompt_ms": 500,
        "t_max_predict_ms": 1000,
    }
    assert http.post("/infill", json=body).status_code == 401
    request_id = f"infill-{uuid.uuid4()}"
    r = http.post("/infill", json={**body, "temperature": 0}, headers={**auth, "x-request-id": request_id})
    assert r.status_code == 200, r.text
    reply = r.json()
    for key in ("content", "stop", "tokens_predicted", "tokens_evaluated", "timings", "generation_settings"):
        assert key in reply, reply
    assert reply["stop"] is True and reply["generation_settings"]["n_ctx"] > 0, reply
    assert reply["content"].strip() and reply["stop_type"] in ("eos", "word"), reply
    # The middle ends where the model ends it or the suffix stop rule does: the file parses.
    ast.parse(body["input_prefix"] + body["prompt"] + reply["content"] + body["input_suffix"])
    assert _booked(server, request_id) == (reply["tokens_evaluated"], reply["tokens_predicted"])
    # Streamed as llama-server streams: `data:` objects, the last one `stop: true` with the counts.
    streamed = http.post("/infill", json={**body, "temperature": 0, "stream": True}, headers=auth)
    lines = [json.loads(p) for p in sse_payloads(streamed.text)]
    assert "[DONE]" not in streamed.text and lines[-1]["stop"] is True, streamed.text
    assert all(line["stop"] is False for line in lines[:-1]), lines
    assert "".join(line["content"] for line in lines) == reply["content"], lines
    assert lines[-1]["tokens_predicted"] == reply["tokens_predicted"], lines[-1]
    # llama.vim's warm-up: empty parts, one token.
    warm = {**body, "input_prefix": "", "input_suffix": "", "prompt": "", "n_predict": 1}
    assert http.post("/infill", json=warm, headers=auth).status_code == 200


def _check_probabilities(probs: list[dict], n_probs: int) -> None:
    for p in probs:
        assert set(p) == {"id", "token", "bytes", "logprob", "top_logprobs"}, p
        assert isinstance(p["id"], int) and p["logprob"] <= 0 and bytes(p["bytes"]).decode("utf-8", "replace") == p["token"], p
        top = p["top_logprobs"]
        assert len(top) == n_probs and all(set(t) == {"id", "token", "bytes", "logprob"} for t in top), top
        assert [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True), top
        # Greedy: the token taken is the likeliest.
        assert top[0]["id"] == p["id"] and top[0]["logprob"] == pytest.approx(p["logprob"]), p


def test_infill_n_probs_reports_each_tokens_probabilities(server, http, auth):
    body = {"input_prefix": "def is_even(n):\n", "input_suffix": "\n", "prompt": "    return", "n_predict": 8,
            "temperature": 0, "n_probs": 3}
    reply = http.post("/infill", json=body, headers=auth).json()
    probs = reply["completion_probabilities"]
    assert len(probs) == reply["tokens_predicted"] > 0, reply
    _check_probabilities(probs, 3)
    # Streamed: each partial object carries its tokens' probabilities.
    streamed = http.post("/infill", json={**body, "stream": True}, headers=auth)
    lines = [json.loads(p) for p in sse_payloads(streamed.text)]
    streamed_probs = [p for line in lines[:-1] for p in line["completion_probabilities"]]
    assert [p["id"] for p in streamed_probs] == [p["id"] for p in probs], lines
    _check_probabilities(streamed_probs, 3)
    # Without n_probs, none; a sampled-after view is not offered.
    plain = http.post("/infill", json={**body, "n_probs": 0}, headers=auth).json()
    assert "completion_probabilities" not in plain, plain
    refused = http.post("/infill", json={**body, "post_sampling_probs": True}, headers=auth)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "post_sampling_probs", refused.text


def test_infill_stops_at_a_line_indented_less_than_n_indent(server, http, auth):
    # llama.cpp's `n_indent`: past the first line, a line indented less (a blank one too) ends
    # the answer, which keeps the line break and indentation before it. The FIM stop rule is off,
    # so the limit alone stops it; without it the model writes the class on.
    body = {
        "input_prefix": "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n",
        "prompt": "    ", "input_suffix": "", "n_predict": 64, "temperature": 0, "fim_stop_rule": False,
    }
    free = http.post("/infill", json=body, headers=auth).json()
    limited = http.post("/infill", json={**body, "n_indent": 4}, headers=auth).json()
    # The same greedy answer, cut where llama.cpp's rule cuts it.
    expected, cut = _indent_limited(free["content"], 4)
    assert cut, f"the model wrote no dedented or blank line to stop at: {free}"
    assert limited["content"] == expected, (limited, free)
    assert limited["tokens_predicted"] < free["tokens_predicted"], (limited, free)
    assert (limited["stop_type"], limited["stopping_word"]) == ("limit", ""), limited


def _indent_limited(text: str, n_indent: int) -> tuple[str, bool]:
    """`text` as llama-server's `n_indent` leaves it: past the first line, at the first line
    indented by fewer than `n_indent` spaces or tabs with anything after that (a blank line too),
    cut after the indentation; and whether it was cut."""
    lines = text.split("\n")
    for i in range(1, len(lines)):
        line = lines[i]
        indent = len(line) - len(line.lstrip(" \t"))
        if indent < n_indent and (indent < len(line) or i < len(lines) - 1):
            return "\n".join(lines[:i] + [line[:indent]]), True
    return text, False


def test_infill_cuts_a_prefix_and_suffix_too_long_for_the_context(server, http, auth, client):
    # About 6,000 tokens on each side of the cursor, three times the context: llama-server keeps
    # the prefix's end and the suffix's start, and so does /infill; /v1/completions refuses it.
    filler = "".join(f"def helper_{i}(x):\n    return x + {i}\n\n" for i in range(400))
    body = {
        "input_prefix": filler + "def is_even(n):\n", "input_suffix": "\n\nassert is_even(4)\n" + filler,
        "prompt": "    return", "n_predict": 16, "temperature": 0,
    }
    r = http.post("/infill", json=body, headers=auth)
    assert r.status_code == 200, r.text
    reply = r.json()
    n_ctx = reply["generation_settings"]["n_ctx"]
    assert n_ctx // 2 < reply["tokens_evaluated"] <= n_ctx - 16, reply
    # The code at the cursor survived the cut: the model writes `is_even`'s return value.
    assert reply["content"].strip(), reply
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(
            model=server.model_id, prompt=body["input_prefix"] + body["prompt"], suffix=body["input_suffix"],
            max_tokens=16,
        )
    assert refused.value.body["code"] == "context_length_exceeded", refused.value.body


@pytest.fixture(scope="module")
def beside():
    with serving(_models()[0], ("--model", "gemma3-270m")) as (srv, c):
        yield srv, c


def test_a_base_model_completes_but_has_no_middle_to_fill(beside):
    _, client = beside
    reply = client.completions.create(model=BASE, prompt="The capital of France is", max_tokens=4, temperature=0)
    assert reply.choices[0].text and reply.usage.completion_tokens >= 1, reply
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=BASE, prompt="def f():\n", suffix="\n    return 1\n", max_tokens=4)
    body = refused.value.body
    assert body["param"] == "suffix" and "fill-in-the-middle" in body["message"], body
