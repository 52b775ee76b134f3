"""Starts the real `gantry serve` binary once per model and hands tests an OpenAI client.

Environment:
  GANTRY_BIN        the binary (default: <repo>/target/debug/gantry)
  GANTRY_E2E_MODEL  a .gguf path or catalogue name; several, comma-separated, run the whole
                    suite once per model (default: the cached qwen2.5-coder-0.5b GGUF)
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from _util import gantry_bin

try:  # the openai SDK 3.x ships its HTTP library as `httpx2`; older ones use `httpx`
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx  # type: ignore[no-redef]

API_KEY = "sk-gantry-e2e-test-key-0123456789abcdef"
STARTUP_TIMEOUT_S = 180
BANNER = re.compile(r"Gantry is serving `(?P<model>[^`]+)` at (?P<base>http://\S+?/v1)\s*$")


def _cache_dir() -> Path:
    root = os.environ.get("GANTRY_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "gantry"


def _models() -> list[str]:
    raw = os.environ.get("GANTRY_E2E_MODEL", "").strip()
    if not raw:
        return [str(_cache_dir() / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")]
    return [m.strip() for m in raw.split(",") if m.strip()]


@dataclass
class Server:
    base_url: str  # http://127.0.0.1:PORT/v1
    root_url: str  # http://127.0.0.1:PORT
    model_id: str
    api_key: str
    data_dir: str
    proc: subprocess.Popen
    stderr_path: str

    def stderr_tail(self, n: int = 60) -> str:
        try:
            with open(self.stderr_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""


# The suite's engine settings, unless a module asks for the server's own defaults.
SUITE_SETTINGS = ("--ctx-size", "2048", "--parallel", "8")


def _start(model: str, extra: tuple[str, ...] = (), settings: tuple[str, ...] = SUITE_SETTINGS,
           public_metrics: bool = True,
           extra_env: dict[str, str] | None = None) -> tuple[Server, tempfile.TemporaryDirectory]:
    """`extra_env`: variables the server gets beside this process's (e.g. `OTEL_*`)."""
    binary = gantry_bin()
    if not os.access(binary, os.X_OK):
        pytest.fail(f"gantry binary not found or not executable: {binary} (build it, or set GANTRY_BIN)")
    if model.endswith(".gguf") and not os.path.exists(model):
        pytest.fail(f"model file not found: {model} (run `make models-e2e`, or set GANTRY_E2E_MODEL)")

    tmp = tempfile.TemporaryDirectory(prefix="gantry-e2e-")
    data_dir = os.path.join(tmp.name, "data")
    os.makedirs(data_dir)
    stderr_path = os.path.join(tmp.name, "server.stderr.log")
    env = dict(os.environ)
    env.pop("GANTRY_API_KEY", None)
    env.update(extra_env or {})
    cmd = [
        binary, "serve",
        "--model", model,
        "--host", "127.0.0.1",
        "--port", "0",
        "--data-dir", data_dir,
        "--api-key", API_KEY,
        *settings,
        # The suite reads /metrics without the admin token; test_connections checks the default.
        *(("--public-metrics",) if public_metrics else ()),
        *extra,
    ]
    stderr_file = open(stderr_path, "wb")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr_file, env=env, stdin=subprocess.DEVNULL)
    stderr_file.close()

    lines: queue.Queue = queue.Queue()

    def pump() -> None:  # keeps draining stdout for the server's whole life
        for raw in iter(proc.stdout.readline, b""):
            lines.put(raw.decode("utf-8", "replace").rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, name=f"gantry-stdout-{proc.pid}", daemon=True).start()

    seen: list[str] = []
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    match = None
    while match is None:
        left = deadline - time.monotonic()
        try:
            line = lines.get(timeout=max(left, 0.01)) if left > 0 else None
        except queue.Empty:
            line = None
        if line is None:
            why = "exited with %s" % proc.poll() if proc.poll() is not None else f"printed no banner in {STARTUP_TIMEOUT_S}s"
            _stop(proc)
            with open(stderr_path, errors="replace") as f:
                err = f.read()[-8000:]
            tmp.cleanup()
            pytest.fail(f"gantry serve {why}.\ncommand: {' '.join(cmd)}\nstdout:\n" + "\n".join(seen) + f"\nstderr:\n{err}")
        seen.append(line)
        match = BANNER.search(line)

    base = match.group("base")
    server = Server(
        base_url=base,
        root_url=base[: -len("/v1")],
        model_id=match.group("model"),
        api_key=API_KEY,
        data_dir=data_dir,
        proc=proc,
        stderr_path=stderr_path,
    )
    return server, tmp


@contextlib.contextmanager
def serving(model: str, extra: tuple[str, ...] = (), settings: tuple[str, ...] = SUITE_SETTINGS,
            public_metrics: bool = True):
    """A server of its own for one test module, with an SDK client; stopped and cleaned up after.
    `settings=()` leaves the engine settings at the server's defaults."""
    srv, tmp = _start(model, extra, settings, public_metrics)
    c = openai.OpenAI(base_url=srv.base_url, api_key=srv.api_key, max_retries=0, timeout=300)
    try:
        yield srv, c
    finally:
        c.close()
        _stop(srv.proc)
        shutil.rmtree(tmp.name, ignore_errors=True)


def _stop(proc: subprocess.Popen) -> int | None:
    """SIGTERM, wait up to 20 s, then SIGKILL. Returns the exit status after SIGTERM, or None if killed."""
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


_CURRENT: dict[str, Server] = {}


@pytest.fixture(scope="session", params=_models(), ids=lambda m: Path(m).stem)
def server(request) -> Server:
    srv, tmp = _start(request.param)
    _CURRENT["server"] = srv
    try:
        yield srv
    finally:
        _CURRENT.pop("server", None)
        status = _stop(srv.proc)
        if status is None:
            warnings.warn(f"gantry did not exit within 20 s of SIGTERM and was killed; stderr tail:\n{srv.stderr_tail()}")
        elif status != 0:
            warnings.warn(f"gantry exited with status {status} after SIGTERM; stderr tail:\n{srv.stderr_tail()}")
        if os.environ.get("GANTRY_E2E_KEEP"):
            print(f"\nkept {tmp.name}")
        else:
            shutil.rmtree(tmp.name, ignore_errors=True)


@pytest.fixture(scope="session")
def client(server: Server) -> openai.OpenAI:
    c = openai.OpenAI(base_url=server.base_url, api_key=server.api_key, max_retries=0, timeout=300)
    yield c
    c.close()


AGENT_MODEL = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"


@pytest.fixture(scope="session")
def agent_server() -> Server:
    """A second server on qwen2.5-coder-1.5b, the smallest catalogue model that finishes agent
    loops (see docs/tools-and-structured-output.md, "Agents"); the 0.5B default is measured against
    it, not held to it."""
    path = os.environ.get("GANTRY_E2E_AGENT_MODEL") or str(_cache_dir() / "models" / AGENT_MODEL)
    srv, tmp = _start(path)
    try:
        yield srv
    finally:
        _stop(srv.proc)
        shutil.rmtree(tmp.name, ignore_errors=True)


@pytest.fixture(scope="session")
def agent_client(agent_server: Server) -> openai.OpenAI:
    c = openai.OpenAI(base_url=agent_server.base_url, api_key=agent_server.api_key, max_retries=0, timeout=300)
    yield c
    c.close()


@pytest.fixture(scope="session")
def http(server: Server):
    """A raw HTTP client on the server's root URL, with no default auth."""
    # Idle connections are dropped well before the server's 10 s keep-alive close, so a request
    # never races that close on a slow machine ("Server disconnected without sending a response").
    with httpx.Client(base_url=server.root_url, timeout=120, limits=httpx.Limits(keepalive_expiry=2)) as c:
        yield c


@pytest.fixture(scope="session")
def auth(server: Server) -> dict:
    return {"Authorization": f"Bearer {server.api_key}"}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Attach the tail of the server's stderr to failing tests."""
    outcome = yield
    report = outcome.get_result()
    srv = _CURRENT.get("server")
    if report.failed and srv is not None:
        report.sections.append(("gantry stderr (tail)", srv.stderr_tail()))
