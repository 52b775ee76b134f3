"""`/tokenize` and `/detokenize` on the default model, in llama-server's shape (`content`,
`add_special`, `with_pieces`; `tokens` → `content`) and vLLM's (`prompt`, or `messages` through
the chat template, with `count` and `max_model_len`; `tokens` → `prompt`): authenticated, round
trips exact, and the tokens agree with what a completion's `usage.prompt_tokens` bills."""

from __future__ import annotations


def test_llama_server_shape_round_trips(server, http, auth):
    text = "def add(a, b):\n    return a + b\n"
    assert http.post("/tokenize", json={"content": text}).status_code == 401
    r = http.post("/tokenize", json={"content": text}, headers=auth)
    assert r.status_code == 200, r.text
    tokens = r.json()["tokens"]
    assert tokens and all(isinstance(t, int) for t in tokens), r.json()
    pieces = http.post("/tokenize", json={"content": text, "with_pieces": True}, headers=auth).json()["tokens"]
    assert [p["id"] for p in pieces] == tokens and "".join(p["piece"] for p in pieces) == text, pieces
    back = http.post("/detokenize", json={"tokens": tokens}, headers=auth)
    assert back.status_code == 200 and back.json()["content"] == text, back.text
    bad = http.post("/detokenize", json={"tokens": [-1]}, headers=auth)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens", bad.text


def test_vllm_shape_counts_what_a_completion_bills(server, client, http, auth):
    prompt = "The quick brown fox"
    r = http.post("/tokenize", json={"model": server.model_id, "prompt": prompt}, headers=auth).json()
    assert r["count"] == len(r["tokens"]) and r["max_model_len"] > 0, r
    reply = client.completions.create(model=server.model_id, prompt=prompt, max_tokens=1)
    assert reply.usage.prompt_tokens == r["count"], (reply.usage, r)
    assert http.post("/detokenize", json={"model": server.model_id, "tokens": r["tokens"]}, headers=auth).json()["prompt"] == prompt
    # A token prompt is the same prompt.
    same = client.completions.create(model=server.model_id, prompt=r["tokens"], max_tokens=1)
    assert same.usage.prompt_tokens == r["count"], same.usage
    messages = [{"role": "user", "content": "Hi"}]
    chat = http.post("/tokenize", json={"model": server.model_id, "messages": messages}, headers=auth).json()
    billed = client.chat.completions.create(model=server.model_id, messages=messages, max_tokens=1)
    assert chat["count"] == billed.usage.prompt_tokens, (chat, billed.usage)


def test_render_gives_the_token_ids_a_request_would_decode(server, client, http, auth):
    # vLLM's render endpoints: the templated prompt (tools included) as token ids, unrun; what a
    # real request then bills as its prompt; authenticated; a model the key lacks is a 404.
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    body = {"model": server.model_id, "messages": [{"role": "user", "content": "Weather in Oslo?"}], "tools": tools}
    assert http.post("/v1/chat/completions/render", json=body).status_code == 401
    r = http.post("/v1/chat/completions/render", json=body, headers=auth)
    assert r.status_code == 200, r.text
    rendered = r.json()
    assert rendered["request_id"].startswith("chatcmpl-") and rendered["features"] is None, rendered
    billed = client.chat.completions.create(**body, max_tokens=1)
    assert len(rendered["token_ids"]) == billed.usage.prompt_tokens, (rendered, billed.usage)
    without_tools = http.post("/v1/chat/completions/render", json={**body, "tools": None}, headers=auth).json()
    assert len(without_tools["token_ids"]) < len(rendered["token_ids"]), "the tools are part of the prompt"
    # Completions: one object per prompt, a `suffix` rendered as the FIM prompt.
    r = http.post("/v1/completions/render", json={"model": server.model_id, "prompt": ["def f(x):\n", "x = "]}, headers=auth)
    assert r.status_code == 200, r.text
    each = r.json()
    assert [len(e["token_ids"]) for e in each] == [
        client.completions.create(model=server.model_id, prompt=p, max_tokens=1).usage.prompt_tokens
        for p in ["def f(x):\n", "x = "]
    ], each
    fim = http.post("/v1/completions/render", json={"model": server.model_id, "prompt": "def f(x):\n",
                                                     "suffix": "\n    return y\n"}, headers=auth).json()
    assert len(fim[0]["token_ids"]) > len(each[0]["token_ids"]), fim
    missing = http.post("/v1/completions/render", json={"model": "no-such-model", "prompt": "x"}, headers=auth)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found", missing.text
