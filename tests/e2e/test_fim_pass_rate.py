"""Fill-in-the-middle on the real default model (qwen2.5-coder-0.5b): six small Python functions,
each given as its head (signature and docstring) and its tail (its last line, or the test after
it) with the body cut. Greedy FIM through `/v1/completions` with `suffix` fills the body; a case
passes when the module parses and its assert holds. Measured at 4/6 with the FIM stop rule (the
two failures are the model's: a palindrome test that lowers one side only, a body at column 0)
and 0/6 without it, where the model runs on into test code or a Markdown fence (docs/api.md,
"Fill-in-the-middle"); held to at least 4/6."""

from __future__ import annotations

import ast

CASES = [
    (
        'def is_palindrome(s: str) -> bool:\n    """True if s reads the same both ways, ignoring case."""\n',
        '\n\nassert is_palindrome("Racecar") and not is_palindrome("abc")\n',
    ),
    (
        'def count_vowels(s: str) -> int:\n    """How many of the letters of s are vowels (a, e, i, o, u), in any case."""\n',
        "    return count\n\n\nassert count_vowels('Hello World') == 3\n",
    ),
    (
        'def fizzbuzz(n: int) -> list[str]:\n    """FizzBuzz from 1 to n: "Fizz" for multiples of 3, "Buzz" of 5, "FizzBuzz" of both."""\n'
        "    out = []\n",
        "    return out\n\n\nassert fizzbuzz(15)[-1] == 'FizzBuzz' and fizzbuzz(5) == ['1', '2', 'Fizz', '4', 'Buzz']\n",
    ),
    (
        'def flatten(nested: list[list[int]]) -> list[int]:\n    """One list of the items of the inner lists, in order."""\n',
        "\n\nassert flatten([[1, 2], [], [3]]) == [1, 2, 3]\n",
    ),
    (
        'def gcd(a: int, b: int) -> int:\n    """The greatest common divisor of a and b, by Euclid\'s algorithm."""\n',
        "    return a\n\n\nassert gcd(12, 18) == 6 and gcd(7, 5) == 1\n",
    ),
    (
        'def word_counts(text: str) -> dict[str, int]:\n    """How often each whitespace-separated word occurs in text."""\n    counts = {}\n',
        "    return counts\n\n\nassert word_counts('a b a') == {'a': 2, 'b': 1}\n",
    ),
]


def _passes(prefix: str, middle: str, suffix: str) -> bool:
    module = prefix + middle + suffix
    try:
        ast.parse(module)
        exec(compile(module, "<fim>", "exec"), {})
    except Exception:  # noqa: BLE001 - any failure is a failed case
        return False
    return True


def _pass_rate(server, client, **extra) -> tuple[int, list[str]]:
    passed, middles = 0, []
    for prefix, suffix in CASES:
        reply = client.completions.create(
            model=server.model_id, prompt=prefix, suffix=suffix, max_tokens=128, temperature=0, **extra,
        )
        middle = reply.choices[0].text
        middles.append(middle)
        passed += _passes(prefix, middle, suffix)
    return passed, middles


def test_greedy_fim_fills_most_bodies_so_that_their_tests_pass(server, client):
    passed, middles = _pass_rate(server, client)
    without_rule, _ = _pass_rate(server, client, extra_body={"fim_stop_rule": False})
    print(f"\nFIM pass rate: {passed}/{len(CASES)} with the FIM stop rule, {without_rule}/{len(CASES)} without")
    assert passed >= 4, (passed, middles)
    # The rule never makes it worse than the model's own end.
    assert passed >= without_rule, (passed, without_rule)
