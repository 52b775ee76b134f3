"""Connection abuse against the real binary: stalled bodies without a key, slow request heads
and trickled bodies cost neither memory nor service, and each such connection is closed.

Loopback only; every loop is bounded."""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import pytest

from conftest import _models, serving
from _util import user

HEADER_TIMEOUT_S = 2
BODY_TIMEOUT_S = 2
STALLED = 200
SLOW_HEADS = 50
BODY = 4 * 1024 * 1024
# Far beyond both timeouts: a connection still open then was never closed by the server.
CLOSE_DEADLINE_S = 60


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a reset also counts)."""
    sock.settimeout(CLOSE_DEADLINE_S)
    received = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return received
        except socket.timeout:
            raise AssertionError(f"the server kept a stalled connection open; got {received[:200]!r}")
        if not chunk:
            return received
        received += chunk


@pytest.fixture(scope="module")
def srv():
    extra = ("--header-read-timeout", str(HEADER_TIMEOUT_S), "--body-read-timeout", str(BODY_TIMEOUT_S),
             "--max-connections", "1024", "--auth-failures-per-minute", "0")
    with serving(_models()[0], extra=extra, settings=("--ctx-size", "1024", "--parallel", "2")) as pair:
        yield pair


def head(host: str, key: str | None, length: int) -> bytes:
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"{auth}Content-Length: {length}\r\n\r\n").encode()


def test_stalled_connections_cost_no_memory_and_are_closed(srv):
    server, client = srv
    url = urlparse(server.root_url)
    addr, host = (url.hostname, url.port), url.netloc
    client.chat.completions.create(model=server.model_id, messages=user("hi"), max_tokens=1)
    rss_before = rss_bytes(server.proc.pid)

    # Every stalled client sends its head and all but the last byte of a 4 MiB body, without a key.
    almost_all = b"x" * (BODY - 1)

    def stall(_: int) -> socket.socket:
        sock = socket.create_connection(addr, timeout=CLOSE_DEADLINE_S)
        sock.sendall(head(host, None, BODY))
        try:
            sock.sendall(almost_all)
        except OSError:
            pass  # refused and closed before the body was sent: what should happen
        return sock

    with ThreadPoolExecutor(max_workers=32) as pool:
        stalled = list(pool.map(stall, range(STALLED)))
    slow = []
    for _ in range(SLOW_HEADS):
        sock = socket.create_connection(addr, timeout=CLOSE_DEADLINE_S)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # and never the rest
        slow.append(sock)
    # An authenticated client that trickles its body past the body read timeout.
    trickle = socket.create_connection(addr, timeout=CLOSE_DEADLINE_S)
    trickle.sendall(head(host, server.api_key, 1000) + b'{"model":')

    # A real client is served meanwhile.
    reply = client.chat.completions.create(model=server.model_id, messages=user("Say hi."), max_tokens=4)
    assert reply.choices[0].message.content is not None

    growth = rss_bytes(server.proc.pid) - rss_before
    assert growth < 64 * 1024 * 1024, f"the server grew by {growth >> 20} MiB for {STALLED} stalled bodies"

    for sock in stalled:
        answer = read_until_closed(sock)
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
        assert b"connection: close" in answer.lower(), answer[:400]
        sock.close()
    for sock in slow:
        assert read_until_closed(sock) == b""  # closed for its head's timeout, no answer
        sock.close()
    answer = read_until_closed(trickle)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b'"code":"request_timeout"' in answer, answer
    trickle.close()

    # Still serving, and its memory stayed bounded throughout.
    client.models.list()
    growth = rss_bytes(server.proc.pid) - rss_before
    assert growth < 64 * 1024 * 1024, f"the server grew by {growth >> 20} MiB"


def test_sdk_reuses_its_connection_after_a_refusal(srv):
    """A refusal before the body (bad key) must not break the SDK's pooled connection."""
    server, client = srv
    import openai

    bad = openai.OpenAI(base_url=server.base_url, api_key="sk-gantry-wrong-key-0123456789abcdef", max_retries=0)
    for _ in range(3):
        with pytest.raises(openai.AuthenticationError):
            bad.chat.completions.create(model=server.model_id, messages=user("x" * 50_000), max_tokens=1)
    bad.close()
    for _ in range(3):
        client.models.list()
