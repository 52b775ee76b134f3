"""Speculative decoding (prompt lookup, `--speculate auto`, the default) on the real model: the
answers, logprobs and usage are exactly those of `--speculate off`, alone and beside other
requests, while draft tokens are actually accepted (read from /metrics)."""

from __future__ import annotations

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


@pytest.fixture(scope="module")
def plain_server():
    """The same model decoding one token at a time."""
    srv, tmp = _start(_models()[0], ("--speculate", "off"))
    try:
        yield srv
    finally:
        _stop(srv.proc)
        shutil.rmtree(tmp.name, ignore_errors=True)


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


def _accepted(server) -> float:
    text = httpx.get(f"{server.root_url}/metrics", timeout=30).text
    m = re.search(r"^gantry_draft_tokens_accepted_total (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


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
    # near-ties); see README, "Speculative decoding".
    want = _ask(plain_server, CODE_EDIT, 400, temperature=0)
    before = _accepted(server)
    # Two at once (both may draft), then three (drafting pauses while the batch is that full).
    for n in (2, 3):
        others = [PROSE, "List five prime numbers and say why each is prime."][: n - 1]
        with ThreadPoolExecutor(max_workers=n) as pool:
            got = list(pool.map(lambda p: _ask(server, p, 400, temperature=0), [CODE_EDIT, *others]))
        assert got[0] == want
    assert _accepted(server) > before


def test_seeded_sampling_is_unchanged(server, plain_server):
    want = _ask(plain_server, CODE_EDIT, 200, temperature=0.8, seed=11)
    assert _ask(server, CODE_EDIT, 200, temperature=0.8, seed=11) == want


def test_stop_string_and_max_tokens_inside_a_drafted_run(server, plain_server):
    # `richest` comes back verbatim: a stop string and a token limit that fall inside it end
    # where decoding one token at a time ends.
    for max_tokens, extra, reason in ((700, {"stop": ["best = account"]}, "stop"), (333, {}, "length")):
        want = _ask(plain_server, CODE_EDIT, max_tokens, temperature=0, **extra)
        assert want[1] == reason, want
        assert _ask(server, CODE_EDIT, max_tokens, temperature=0, **extra) == want
