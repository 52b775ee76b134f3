"""Small helpers shared by the end-to-end tests."""

from __future__ import annotations

import json
import os
from pathlib import Path
from dataclasses import dataclass, field

try:
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[2]


def gantry_bin() -> str:
    """GANTRY_BIN, or the debug build of this checkout."""
    return os.environ.get("GANTRY_BIN") or str(REPO / "target" / "debug" / "gantry")


__all__ = ["gantry_bin", "ledger_rows", "httpx", "user", "StreamResult", "collect_stream", "error_body", "sse_payloads"]


def ledger_rows(server, client_request_id: str) -> list[dict]:
    """The ledger's rows (`gantry usage --requests`) of the request sent with this `x-request-id`."""
    import subprocess

    out = subprocess.run(
        [gantry_bin(), "usage", "--data-dir", server.data_dir, "--requests", "--format", "json"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return [r for r in json.loads(out.stdout) if r["client_request_id"] == client_request_id]


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


@dataclass
class StreamResult:
    chunks: list = field(default_factory=list)
    # per choice index
    contents: dict = field(default_factory=dict)
    deltas: dict = field(default_factory=dict)
    finish_reasons: dict = field(default_factory=dict)  # index -> list of finish reasons seen

    def content(self, index: int = 0) -> str:
        return self.contents.get(index, "")

    @property
    def usage(self):
        return self.chunks[-1].usage if self.chunks else None


def collect_stream(stream) -> StreamResult:
    """Reads an SDK stream to its end and reassembles each choice's content."""
    res = StreamResult()
    for chunk in stream:
        res.chunks.append(chunk)
        for choice in chunk.choices:
            i = choice.index
            text = choice.delta.content if choice.delta is not None else None
            if text:
                res.contents[i] = res.contents.get(i, "") + text
                res.deltas.setdefault(i, []).append(text)
            if choice.finish_reason is not None:
                res.finish_reasons.setdefault(i, []).append(choice.finish_reason)
    return res


def error_body(resp) -> dict:
    """Asserts an HTTP response carries OpenAI's JSON error shape and returns its `error` object."""
    ctype = resp.headers.get("content-type", "")
    assert ctype.startswith("application/json"), f"status {resp.status_code}: content-type {ctype!r}, body {resp.text[:300]!r}"
    body = resp.json()
    assert isinstance(body, dict) and set(body) == {"error"}, f"body {body!r}"
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, f"error keys {sorted(err)}: {err!r}"
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str) and err["type"], err
    return err


def sse_payloads(body: str) -> list[str]:
    """The `data:` payloads of an SSE body, in order (comments and other fields ignored)."""
    out = []
    for event in body.split("\n\n"):
        data = [l[5:].lstrip(" ") for l in event.split("\n") if l.startswith("data:")]
        if data:
            out.append("\n".join(data))
    return out


def parse_json(s: str):
    return json.loads(s)
