"""Gemma 3 270M, Google's base (pretrained) model, served beside the default chat model. Its GGUF
has no chat template, so a chat on it is the client's 400 in every dialect (through the openai
and anthropic SDKs), streamed or not, naming the model and billed nothing; the model is loaded all
the same (it is served for completions), and the chat model beside it streams to [DONE] with a
usage that is the tokens it produced, as the ledger books them."""

from __future__ import annotations

import json
import re
import subprocess
import time
import uuid

import anthropic
import openai
import pytest

from _util import gantry_bin, httpx, ledger_rows, sse_payloads, user
from conftest import _models, serving

# `--model gemma3-270m` serves the catalogue's file under its file name's stem.
BASE = "gemma-3-270m-q4_k_m"


@pytest.fixture(scope="module")
def beside():
    with serving(_models()[0], ("--model", "gemma3-270m")) as (srv, c):
        yield srv, c


def _refusal(message: str) -> None:
    assert f"`{BASE}`" in message and "no chat template" in message, message


def test_a_chat_on_the_base_model_is_a_clear_400_in_every_dialect(beside):
    srv, client = beside
    assert [m.id for m in client.models.list().data] == [srv.model_id, BASE]
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as chat:
            client.chat.completions.create(model=BASE, messages=user("Hello"), max_tokens=4, stream=stream)
        assert chat.value.status_code == 400 and chat.value.body["param"] == "model", chat.value.body
        _refusal(chat.value.body["message"])

        with pytest.raises(openai.BadRequestError) as responses:
            client.responses.create(model=BASE, input="Hello", max_output_tokens=16, stream=stream)
        _refusal(responses.value.body["message"])

        claude = anthropic.Anthropic(base_url=srv.root_url, api_key=srv.api_key, max_retries=0)
        with pytest.raises(anthropic.BadRequestError) as messages:
            claude.messages.create(model=BASE, max_tokens=4, messages=user("Hello"), stream=stream)
        assert messages.value.body["error"]["type"] == "invalid_request_error", messages.value.body
        _refusal(messages.value.body["error"]["message"])

    # Refused, yet loaded once and kept: the model is served, only chat is not.
    metrics = httpx.get(f"{srv.root_url}/metrics", timeout=30).text
    loaded = re.search(rf'^gantry_model_loaded_bytes{{model="{BASE}"}} (\S+)$', metrics, re.M)
    assert loaded and float(loaded.group(1)) > 0, metrics
    assert f'gantry_model_loads_total{{model="{BASE}"}} 1' in metrics, metrics


def test_the_chat_model_beside_it_streams_to_done_with_the_tokens_it_made(beside):
    srv, _ = beside
    request_id = f"base-model-{uuid.uuid4()}"
    body = {
        "model": srv.model_id, "messages": user("Name a primary color."), "max_tokens": 8, "temperature": 0,
        "stream": True, "stream_options": {"include_usage": True}, "logprobs": True,
    }
    headers = {"Authorization": f"Bearer {srv.api_key}", "x-request-id": request_id}
    raw = httpx.post(f"{srv.base_url}/chat/completions", json=body, headers=headers, timeout=120).text
    payloads = sse_payloads(raw)
    assert payloads[-1] == "[DONE]" and payloads.count("[DONE]") == 1, raw[-300:]
    chunks = [json.loads(p) for p in payloads[:-1]]
    usage = chunks[-1]["usage"]
    # One logprobs entry for each token produced, so the entries count the billed tokens.
    produced = sum(len((c["logprobs"] or {}).get("content") or []) for ch in chunks for c in ch["choices"])
    assert 1 <= usage["completion_tokens"] == produced <= 8, (usage, produced)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"], usage

    rows: list[dict] = []
    for _ in range(100):
        rows = ledger_rows(srv, request_id)
        if rows:
            break
        time.sleep(0.1)
    assert [(r["prompt_tokens"], r["completion_tokens"]) for r in rows] == [
        (usage["prompt_tokens"], usage["completion_tokens"])
    ], rows
    # The refused chats on the base model booked nothing.
    out = subprocess.run(
        [gantry_bin(), "usage", "--requests", "--data-dir", srv.data_dir, "--format", "json"],
        check=True, capture_output=True, text=True,
    )
    assert BASE not in {r["model"] for r in json.loads(out.stdout)}, out.stdout
