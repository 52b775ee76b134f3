"""Speculative decoding (prompt lookup and grammar jump-forward, `--speculate auto`, the default)
on the real model: the answers, logprobs and usage are exactly those of `--speculate off`, alone
and beside other requests, while draft tokens are actually accepted (read from /metrics)."""

from __future__ import annotations

import json
import re
import time
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest

from _util import httpx, user
from conftest import _models, _start, _stop

# A code edit: the file comes back almost verbatim, so most of the answer can be drafted from
# the prompt.
SOURCE = "\n".join(
    [
        "import math",
        "",
        "",
        "class Account:",
        '    """A bank account with a balance and a history of moves."""',
        "",
        "    def __init__(self, owner, balance=0.0):",
        "        self.owner = owner",
        "        self.balance = balance",
        "        self.history = []",
        "",
        "    def deposit(self, amount):",
        "        if amount <= 0:",
        '            raise ValueError("amount must be positive")',
        "        self.balance += amount",
        '        self.history.append(("deposit", amount))',
        "        return self.balance",
        "",
        "    def withdraw(self, amount):",
        "        if amount <= 0:",
        '            raise ValueError("amount must be positive")',
        "        if amount > self.balance:",
        '            raise ValueError("insufficient funds")',
        "        self.balance -= amount",
        '        self.history.append(("withdraw", amount))',
        "        return self.balance",
        "",
        "    def interest(self, rate, years):",
        "        total = self.balance * math.pow(1 + rate, years)",
        "        return round(total - self.balance, 2)",
        "",
        "    def statement(self):",
        "        lines = []",
        "        for kind, amount in self.history:",
        '            lines.append(f"{kind}: {amount:.2f}")',
        '        lines.append(f"balance: {self.balance:.2f}")',
        '        return "\\n".join(lines)',
        "",
        "",
        "def transfer(source, target, amount):",
        "    source.withdraw(amount)",
        "    target.deposit(amount)",
        "    return source.balance, target.balance",
        "",
        "",
        "def total_balance(accounts):",
        "    total = 0.0",
        "    for account in accounts:",
        "        total += account.balance",
        "    return total",
        "",
        "",
        "def richest(accounts):",
        "    best = None",
        "    for account in accounts:",
        "        if best is None or account.balance > best.balance:",
        "            best = account",
        "    return best",
        "",
        "",
        'if __name__ == "__main__":',
        '    a = Account("ann", 100.0)',
        '    b = Account("bob", 50.0)',
        "    transfer(a, b, 25.0)",
        "    print(total_balance([a, b]))",
        "    print(richest([a, b]).owner)",
    ]
)
CODE_EDIT = (
    "Rename the function `transfer` to `move_money` everywhere in this file. "
    "Reply with the whole file only.\n\n```python\n" + SOURCE + "\n```"
)
PROSE = "Write a short paragraph about the history of lighthouses."


def _own_server(*extra):
    """A server of this module's own on the first e2e model, with `extra` flags."""
    srv, tmp = _start(_models()[0], extra)
    try:
        yield srv
    finally:
        _stop(srv.proc)
        shutil.rmtree(tmp.name, ignore_errors=True)


@pytest.fixture(scope="module")
def plain_server():
    """The same model decoding one token at a time."""
    yield from _own_server("--speculate", "off")


@pytest.fixture(scope="module")
def always_server():
    """The same model feeding every draft it proposes (`--speculate always`). Under `auto` the
    scheduler feeds a draft only where its measured step costs say it pays, which depends on the
    CPU: on an AMD EPYC (Zen 4) each extra position of a step costs about half a one-token step,
    and `auto` rightly declined most drafts of a two-request test. The drafting mechanism itself
    is asserted here, where it does not depend on that judgement."""
    yield from _own_server("--speculate", "always")


def _ask(server, prompt, max_tokens, **extra):
    body = {"model": server.model_id, "messages": user(prompt), "max_tokens": max_tokens, "logprobs": True, **extra}
    r = httpx.post(
        f"{server.base_url}/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {server.api_key}"},
        timeout=600,
    )
    assert r.status_code == 200, r.text
    data = r.json()
    choice = data["choices"][0]
    tokens = [t["token"] for t in choice["logprobs"]["content"]]
    usage = data["usage"]["completion_tokens"]
    assert usage == len(tokens), "every billed token is delivered once, with its logprobs entry"
    return choice["message"]["content"], choice["finish_reason"], tokens


def _accepted(server, counter: str = "gantry_draft_tokens_accepted_total") -> float:
    text = httpx.get(f"{server.root_url}/metrics", timeout=30).text
    m = re.search(rf"^{counter}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)  # labelled by model
    return float(m.group(1)) if m else 0.0


def _forced(server) -> tuple[float, float]:
    return _accepted(server, "gantry_forced_tokens_total"), _accepted(server, "gantry_forced_tokens_accepted_total")


def test_code_edit_is_unchanged_and_drafts_are_accepted(server, plain_server):
    started = time.monotonic()
    want = _ask(plain_server, CODE_EDIT, 700, temperature=0)
    print(f"one token per step: {time.monotonic() - started:.1f} s, {len(want[2])} tokens")
    # (Whether the 0.5B does the rename is the model's business; it returns the file.)
    assert "def richest(accounts):" in want[0], want[0]
    assert _accepted(plain_server) == 0
    before = _accepted(server)
    started = time.monotonic()
    assert _ask(server, CODE_EDIT, 700, temperature=0) == want
    print(f"speculative: {time.monotonic() - started:.1f} s")
    assert _accepted(server) - before > 50, "most of the file was drafted from the prompt"


def test_unchanged_beside_other_requests(server, plain_server):
    # Exactness is asserted on the code edit, whose drafts are long and whose next tokens win by a
    # wide margin. Prose beside it is load only: on the real model, prose decoded with and
    # without drafts drifted apart after a few dozen tokens (the KV values of a multi-token
    # verification batch differ in their last bits from one-token decoding, and prose has
    # near-ties); see docs/scheduling-and-speculation.md, "Speculative decoding".
    want = _ask(plain_server, CODE_EDIT, 400, temperature=0)
    before = _accepted(server)
    # Two at once (both may draft), then three (drafting pauses while the batch is that full).
    for n in (2, 3):
        others = [PROSE, "List five prime numbers and say why each is prime."][: n - 1]
        with ThreadPoolExecutor(max_workers=n) as pool:
            got = list(pool.map(lambda p: _ask(server, p, 400, temperature=0), [CODE_EDIT, *others]))
        assert got[0] == want
    assert _accepted(server) > before


def _fed(server) -> float:
    return _accepted(server, "gantry_draft_tokens_total") + _forced(server)[0]


def test_seeded_sampling_is_reproducible(server, plain_server):
    # A seeded sampled request decodes one token at a time under `--speculate auto`: a draw that
    # lands where a verification batch's rounding moved the margin would pick another token, and
    # whether a position gets batched depends on what the server learned before. So it is the
    # same as `--speculate off`, and the same again on a server that has drafted since.
    want = _ask(plain_server, CODE_EDIT, 200, temperature=0.8, seed=11)
    before = _fed(server)
    assert _ask(server, CODE_EDIT, 200, temperature=0.8, seed=11) == want
    assert _fed(server) == before, "nothing was fed ahead for the seeded request"
    assert _ask(server, CODE_EDIT, 120, temperature=0) and _fed(server) > before, "greedy drafts"
    assert _ask(server, CODE_EDIT, 200, temperature=0.8, seed=11) == want


def test_stop_string_and_max_tokens_inside_a_drafted_run(server, plain_server):
    # `richest` comes back verbatim: a stop string and a token limit that fall inside it end
    # where decoding one token at a time ends.
    for max_tokens, extra, reason in ((700, {"stop": ["best = account"]}, "stop"), (333, {}, "length")):
        want = _ask(plain_server, CODE_EDIT, max_tokens, temperature=0, **extra)
        assert want[1] == reason, want
        assert _ask(server, CODE_EDIT, max_tokens, temperature=0, **extra) == want


# Extraction under a schema: keys, quotes and colons are forced by the grammar and fed ahead.
PARAGRAPH = (
    "Maria Lopez, 34, ordered three standing desks from our Lisbon warehouse on 12 March. "
    "She is a returning customer, paid by card, and asked for delivery before Friday."
)
SCHEMA = {
    "type": "object",
    "properties": {
        "customer_name": {"type": "string"},
        "customer_age": {"type": "integer"},
        "product": {"type": "string"},
        "quantity": {"type": "integer"},
        "warehouse_city": {"type": "string"},
        "order_date": {"type": "string"},
        "returning_customer": {"type": "boolean"},
        "payment_method": {"type": "string", "enum": ["card", "cash", "transfer"]},
    },
    "required": [
        "customer_name",
        "customer_age",
        "product",
        "quantity",
        "warehouse_city",
        "order_date",
        "returning_customer",
        "payment_method",
    ],
    "additionalProperties": False,
}


def test_jump_forward_under_a_schema_is_unchanged(server, plain_server):
    fmt = {"type": "json_schema", "json_schema": {"name": "order", "schema": SCHEMA, "strict": True}}
    prompt = "Extract the order from this message as JSON.\n\n" + PARAGRAPH
    want = _ask(plain_server, prompt, 300, temperature=0, response_format=fmt)
    assert json.loads(want[0]).keys() == SCHEMA["properties"].keys(), want[0]
    assert _forced(plain_server) == (0, 0), "--speculate off feeds nothing ahead"
    before = _forced(server)
    assert _ask(server, prompt, 300, temperature=0, response_format=fmt) == want
    fed, taken = (a - b for a, b in zip(_forced(server), before))
    assert fed >= 8, f"the keys' tokens were fed ahead: {fed}"
    assert taken == fed, "a forced token is always the sampled one"


def test_jump_forward_in_a_forced_tool_call_is_unchanged(server, plain_server):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "create_shipping_label",
                "description": "Create a shipping label for an order.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "recipient_name": {"type": "string"},
                        "destination_city": {"type": "string"},
                        "package_count": {"type": "integer"},
                    },
                    "required": ["recipient_name", "destination_city", "package_count"],
                },
            },
        }
    ]
    choice = {"type": "function", "function": {"name": "create_shipping_label"}}
    body = {"tools": tools, "tool_choice": choice}
    # Every argument is spelled out, so the answer has no near-tie (say "Lisbon" against
    # "Lisboa") that the float noise of a differently chunked prefill could tip: without
    # `--deterministic-greedy` greedy decoding is not batch-invariant, drafted or not.
    prompt = (
        "Ship this order: 3 packages for Maria Lopez, to be delivered to the city of Chicago. "
        "Use exactly these values."
    )

    def call(srv):
        r = httpx.post(
            f"{srv.base_url}/chat/completions",
            json={"model": srv.model_id, "messages": user(prompt), "temperature": 0, "max_tokens": 200, **body},
            headers={"Authorization": f"Bearer {srv.api_key}"},
            timeout=600,
        )
        assert r.status_code == 200, r.text
        data = r.json()
        return data["choices"][0]["message"]["tool_calls"], data["usage"]

    want_calls, want_usage = call(plain_server)
    assert want_calls[0]["function"]["name"] == "create_shipping_label"
    args = json.loads(want_calls[0]["function"]["arguments"])
    assert set(args) == {"recipient_name", "destination_city", "package_count"}, args
    before = _forced(server)
    got_calls, got_usage = call(server)
    assert [c["function"] for c in got_calls] == [c["function"] for c in want_calls]
    # (cached_tokens depends on what each server ran before.)
    assert (got_usage["prompt_tokens"], got_usage["completion_tokens"]) == (
        want_usage["prompt_tokens"],
        want_usage["completion_tokens"],
    )
    fed, taken = (a - b for a, b in zip(_forced(server), before))
    assert fed >= 5 and taken == fed, (fed, taken)


# Drafting across requests: answers to the same schema share keys, layout and punctuation, so a
# later answer copies them from an earlier one (recent answers are kept per model).
ORDERS = [
    "Hello, this is Aiko Tanaka, 27. I ordered 2 desk lamps from the Osaka warehouse on 3 May and paid in cash. "
    "I am not a returning customer: this is my first order.",
    "Pierre Dubois here, 63 years old. On 9 June I bought 5 wool blankets from the Lyon warehouse and paid by card. "
    "I am a returning customer.",
]


def _shared(server) -> float:
    return _accepted(server, "gantry_draft_tokens_shared_accepted_total")


def test_answers_copy_from_earlier_answers_and_are_unchanged(server, always_server, plain_server):
    fmt = {"type": "json_schema", "json_schema": {"name": "order", "schema": SCHEMA, "strict": True}}
    prompts = ["Extract the order from this message as JSON.\n\n" + p for p in ORDERS]
    want = [_ask(plain_server, p, 300, temperature=0, response_format=fmt) for p in prompts]
    for w in want:
        assert json.loads(w[0]).keys() == SCHEMA["properties"].keys(), w[0]
    assert _shared(plain_server) == 0, "--speculate off copies nothing"
    # The same documents, not always the same text: the layout between JSON tokens is free under
    # the grammar, and where a space and a tab nearly tie, a multi-token verification batch's
    # rounding can pick the other (a fresh-clone make test on an AMD EPYC got "  \t," for "  ,").
    # `auto` (the default) copies where it pays on this CPU.
    def same_document(answer, expected):
        assert answer[1] == expected[1] == "stop"
        assert json.loads(answer[0]) == json.loads(expected[0]), (answer[0], expected[0])

    for p, w in zip(prompts, want):
        same_document(_ask(server, p, 300, temperature=0, response_format=fmt), w)
    same_document(_ask(always_server, prompts[0], 300, temperature=0, response_format=fmt), want[0])
    before = _shared(always_server)
    same_document(_ask(always_server, prompts[1], 300, temperature=0, response_format=fmt), want[1])
    copied = _shared(always_server) - before
    assert copied >= 8, f"keys and layout were copied from the first answer: {copied}"
