"""The Batch API on a tiny generated model (`tiny-gguf`), through the official SDK: the same
lifecycle `test_batches.py` checks on the real default model, where lines are cheap enough to
run many of them. Every line asks for a fixed length (`ignore_eos`), so each answer's length
says it ran to its end.

- 200 chat lines complete: each answered once, and billed once in tier `batch`;
- a batch cancelled halfway delivers and bills only its finished lines;
- a server killed with `kill -9` mid-batch resumes after a restart on the same data directory:
  every line answered once and billed once.

Nothing is asserted on the clock: batches and the ledger are polled with generous deadlines."""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from _util import gantry_bin
from conftest import _start, _stop
from test_batches import (ADMIN_TOKEN, _chat_line, _client, _completed_at_least, _ended_halfway, _key, _ledger,
                          _read, _submit, _wait)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    binary = Path(gantry_bin()).with_name("tiny-gguf")
    if not binary.exists():
        pytest.fail(f"{binary} not found: `make test` builds it (cargo build --workspace)")
    model = tmp_path_factory.mktemp("tiny-batches") / "tiny.gguf"
    subprocess.run([str(binary), str(model)], check=True)
    return str(model)


def _line(model_id: str, custom_id: str, tokens: int) -> dict:
    return _chat_line(model_id, custom_id, max_tokens=tokens, ignore_eos=True)


def _check_answered_once(client, batch, lines: list[dict], tokens: int) -> list[dict]:
    assert batch.status == "completed", batch.to_dict()
    n = len(lines)
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (n, n, 0)
    out = _read(client, batch.output_file_id)
    assert Counter(line["custom_id"] for line in out) == Counter(line["custom_id"] for line in lines), \
        "every line answered exactly once"
    for line in out:
        assert line["response"]["status_code"] == 200, line
        assert line["response"]["body"]["usage"]["completion_tokens"] == tokens, line
    return out


def test_two_hundred_lines_complete_each_answered_and_billed_once(tiny, tmp_path):
    srv, tmp = _start(tiny, ("--admin-token", ADMIN_TOKEN, "--batch-concurrency", "4"),
                      ("--ctx-size", "512", "--parallel", "4"))
    try:
        key = _key(srv)
        model_id = Path(tiny).stem
        lines = [_line(model_id, f"t{i:03d}", 6) for i in range(200)]
        batch = _submit(key.client, lines)
        out = _check_answered_once(key.client, _wait(srv, key.client, batch.id), lines, 6)
        rows = _ledger(srv, key.name, {line["id"] for line in out})
        assert Counter(r["request_id"] for r in rows) == Counter(line["id"] for line in out), "billed once each"
        assert all(r["service_tier"] == "batch" and r["batch_id"] == batch.id for r in rows), rows[:3]
    finally:
        _stop(srv.proc)
        shutil.rmtree(tmp.name, ignore_errors=True)


def test_cancelling_halfway_bills_only_the_finished_lines(tiny):
    srv, tmp = _start(tiny, ("--admin-token", ADMIN_TOKEN, "--batch-concurrency", "1"),
                      ("--ctx-size", "512", "--parallel", "1"))
    try:
        key = _key(srv)
        n = 400
        lines = [_line(Path(tiny).stem, f"c{i:03d}", 64) for i in range(n)]
        batch = _submit(key.client, lines)
        _wait(srv, key.client, batch.id, _completed_at_least(2), "two completed lines")
        key.client.batches.cancel(batch.id)
        done = _wait(srv, key.client, batch.id)
        assert done.status == "cancelled", done.to_dict()
        out = _ended_halfway(key.client, done, lines, 64, "batch_cancelled")
        rows = _ledger(srv, key.name, {line["id"] for line in out})
        assert Counter(r["request_id"] for r in rows) == Counter(line["id"] for line in out), "only what finished"
    finally:
        _stop(srv.proc)
        shutil.rmtree(tmp.name, ignore_errors=True)


def test_a_batch_survives_kill_9_each_line_answered_and_billed_once(tiny, tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    extra = ("--admin-token", ADMIN_TOKEN, "--data-dir", str(data_dir), "--heartbeat-timeout", "3",
             "--batch-concurrency", "2")
    settings = ("--ctx-size", "512", "--parallel", "2")
    started = []
    try:
        first, tmp = _start(tiny, extra, settings)
        started.append((first, tmp))
        key = _key(first)
        lines = [_line(Path(tiny).stem, f"k{i:03d}", 48) for i in range(200)]
        batch = _submit(key.client, lines)
        _wait(first, key.client, batch.id, _completed_at_least(3), "three completed lines")
        first.proc.kill()  # SIGKILL: nothing is drained or flushed
        first.proc.wait(timeout=60)

        second, tmp = _start(tiny, extra, settings)
        started.append((second, tmp))
        client = _client(second, key.secret)
        resumed = client.batches.retrieve(batch.id)
        assert resumed.status != "completed", f"finished before the kill: the test proves nothing: {resumed.to_dict()}"
        out = _check_answered_once(client, _wait(second, client, batch.id), lines, 48)
        rows = _ledger(second, key.name, {line["id"] for line in out})
        assert Counter(r["request_id"] for r in rows) == Counter(line["id"] for line in out), "billed once each"
    finally:
        for s, t in started:
            _stop(s.proc)
            shutil.rmtree(t.name, ignore_errors=True)
