"""Images in, answers out: a tiny random-weight model with a tiny projector (both written by the
`tiny-gguf` binary of this checkout), served with `--mmproj`, asked through the official SDK and
LangChain with data URLs and with an http URL served by a local test server. The answers are
noise; what is checked is that the image reaches the model, is billed exactly and is cached by
content, and that bad images get clear 400s."""

from __future__ import annotations

import base64
import http.server
import re
import shutil
import struct
import subprocess
import tempfile
import threading
import zlib
from pathlib import Path

import openai
import pytest

from _util import gantry_bin, httpx
from conftest import _start, _stop


def png(seed: int, w: int = 48, h: int = 40) -> bytes:
    """A small RGB PNG whose pixels depend on `seed` (no imaging library needed)."""
    rows = b"".join(b"\x00" + bytes(((x * seed) & 255, (y ^ seed) & 255, seed & 255)[c] for x in range(w) for c in range(3)) for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def data_url(image: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(image).decode()


@pytest.fixture(scope="module")
def vision():
    """(server, client) for the tiny vision model, plus the URL of a local image server."""
    tiny = Path(gantry_bin()).with_name("tiny-gguf")
    if not tiny.exists():
        pytest.fail(f"{tiny} not found: `make test` builds it (cargo build --workspace)")
    work = tempfile.mkdtemp(prefix="gantry-vision-")
    subprocess.run([str(tiny), "--vision", work], check=True)
    model, mmproj = f"{work}/model.gguf", f"{work}/mmproj.gguf"

    image = png(7)

    class Images(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's naming)
            body = image if self.path == "/cat.png" else b"not an image"
            self.send_response(200 if self.path in ("/cat.png", "/broken.png") else 404)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    images = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Images)
    threading.Thread(target=images.serve_forever, daemon=True).start()
    srv, tmp = _start(model, ("--mmproj", mmproj, "--parallel", "2", "--allow-image-host", "127.0.0.1"))
    client = openai.OpenAI(base_url=srv.base_url, api_key=srv.api_key, max_retries=0, timeout=120)
    try:
        yield srv, client, f"http://127.0.0.1:{images.server_address[1]}", image
    finally:
        client.close()
        _stop(srv.proc)
        images.shutdown()
        shutil.rmtree(tmp.name, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def ask(client, model, url, text="What is in this picture?", **kw):
    return client.chat.completions.create(
        model=model,
        temperature=0,
        max_tokens=8,
        messages=[{"role": "user", "content": [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]}],
        **kw,
    )


def image_tokens_total(srv) -> float:
    text = httpx.get(f"{srv.root_url}/metrics", timeout=30).text
    m = re.search(r"^gantry_image_tokens_total(?:\{[^}]*\})? (\S+)$", text, re.M)  # labelled by model
    return float(m.group(1)) if m else 0.0


def test_an_image_is_billed_by_the_positions_the_model_consumed(vision):
    srv, client, _, image = vision
    text_only = client.chat.completions.create(
        model=srv.model_id, temperature=0, max_tokens=8, messages=[{"role": "user", "content": "What is in this picture?"}]
    )
    before = image_tokens_total(srv)
    with_image = ask(client, srv.model_id, data_url(png(11)))
    evaluated = image_tokens_total(srv) - before
    assert evaluated > 0, "the scheduler evaluated the image"
    assert with_image.choices[0].finish_reason in ("stop", "length")
    assert with_image.usage.completion_tokens > 0
    # The image part adds exactly the positions the model consumed for it, nothing else.
    assert with_image.usage.prompt_tokens == text_only.usage.prompt_tokens + evaluated
    assert with_image.usage.total_tokens == with_image.usage.prompt_tokens + with_image.usage.completion_tokens


def test_streamed_usage_matches_and_the_same_image_comes_from_the_cache(vision):
    srv, client, _, _ = vision
    url = data_url(png(23))
    plain = ask(client, srv.model_id, url)
    stream = ask(client, srv.model_id, url, stream=True, stream_options={"include_usage": True})
    text, usage = "", None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
        if chunk.usage:
            usage = chunk.usage
    assert usage is not None
    assert usage.prompt_tokens == plain.usage.prompt_tokens
    assert text == plain.choices[0].message.content, "temperature 0 gives the same answer streamed"
    # The second request found the whole prompt, image included, in the cache.
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens - 1
    # A different image in the same place reuses only the text before it.
    text_only = client.chat.completions.create(
        model=srv.model_id, temperature=0, max_tokens=8, messages=[{"role": "user", "content": "What is in this picture?"}]
    )
    image_positions = plain.usage.prompt_tokens - text_only.usage.prompt_tokens
    other = ask(client, srv.model_id, data_url(png(24)))
    assert other.usage.prompt_tokens == plain.usage.prompt_tokens
    assert 0 < other.usage.prompt_tokens_details.cached_tokens < plain.usage.prompt_tokens - image_positions


def test_an_http_image_url_is_fetched_and_read(vision):
    srv, client, base, image = vision
    by_url = ask(client, srv.model_id, f"{base}/cat.png")
    inline = ask(client, srv.model_id, data_url(image))
    assert by_url.usage.prompt_tokens == inline.usage.prompt_tokens
    assert by_url.choices[0].message.content == inline.choices[0].message.content


def test_bad_images_are_400s_naming_the_part(vision):
    srv, client, base, _ = vision
    broken = data_url(png(3)[:60])
    for url in (broken, f"{base}/broken.png"):
        with pytest.raises(openai.BadRequestError) as e:
            ask(client, srv.model_id, url)
        err = e.value.body
        assert err["param"] == "messages[0].content[1].image_url", err
        assert err["type"] == "invalid_request_error"


def test_langchain_human_message_with_an_image(vision):
    import langchain_openai  # in tests/e2e/requirements.txt: missing is a failure
    from langchain_core.messages import HumanMessage

    srv, client, _, image = vision
    llm = langchain_openai.ChatOpenAI(
        model=srv.model_id, base_url=srv.base_url, api_key=srv.api_key, temperature=0, max_tokens=8, max_retries=0
    )
    message = HumanMessage(
        content=[{"type": "text", "text": "What is in this picture?"}, {"type": "image_url", "image_url": {"url": data_url(image)}}]
    )
    answer = llm.invoke([message])
    sdk = ask(client, srv.model_id, data_url(image))
    assert answer.usage_metadata["input_tokens"] == sdk.usage.prompt_tokens
    assert answer.content == sdk.choices[0].message.content
