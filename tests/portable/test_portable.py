"""The portable build (`make build-portable`, the container image's) served end to end: it loads
the best of ggml's CPU variants this machine runs, says which in its log and /metrics, serves the
openai SDK, and fails at start with the reason when no variant runs.

`make test-portable` builds it and sets GANTRY_PORTABLE_DIR; without that these tests skip, and
say so.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import openai
import pytest

PORTABLE = os.environ.get("GANTRY_PORTABLE_DIR")
pytestmark = pytest.mark.skipif(not PORTABLE, reason="GANTRY_PORTABLE_DIR is not set (make test-portable sets it)")
MODEL = Path.home() / ".cache" / "gantry" / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
KEY = "sk-gantry-portable-test-0123456789"

# ggml/src/CMakeLists.txt's x86 variants and the /proc/cpuinfo flags each needs.
HASWELL = {"sse4_2", "avx", "f16c", "fma", "avx2", "bmi2"}
SKYLAKEX = HASWELL | {"avx512f"}
VARIANTS = {
    "x64": set(),
    "sse42": {"sse4_2"},
    "sandybridge": {"sse4_2", "avx"},
    "ivybridge": {"sse4_2", "avx", "f16c"},
    "piledriver": {"sse4_2", "avx", "f16c", "fma"},
    "haswell": HASWELL,
    "skylakex": SKYLAKEX,
    "cannonlake": SKYLAKEX | {"avx512vbmi"},
    "cascadelake": SKYLAKEX | {"avx512_vnni"},
    "icelake": SKYLAKEX | {"avx512vbmi", "avx512_vnni"},
    "cooperlake": SKYLAKEX | {"avx512_vnni", "avx512_bf16"},
    "zen4": SKYLAKEX | {"avx512vbmi", "avx512_vnni", "avx512_bf16"},
    "alderlake": HASWELL | {"avx_vnni"},
    "sapphirerapids": SKYLAKEX | {"avx512vbmi", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8"},
}


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    raise AssertionError("no flags line in /proc/cpuinfo")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    def __init__(self, env: dict[str, str]):
        self.port = free_port()
        self.data = tempfile.mkdtemp(prefix="gantry-portable-")
        self.log = Path(self.data) / "stderr.log"
        args = [str(Path(PORTABLE) / "gantry"), "serve", "--model", str(MODEL), "--port", str(self.port),
                "--data-dir", self.data, "--api-key", KEY, "--ctx-size", "1024", "--parallel", "2",
                "--public-metrics"]
        self.proc = subprocess.Popen(args, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=self.log.open("w"))

    def wait_ready(self) -> None:
        import urllib.request

        deadline = time.time() + 120
        while time.time() < deadline:
            assert self.proc.poll() is None, f"gantry exited {self.proc.returncode}:\n{self.log.read_text()}"
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health/ready", timeout=2).status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"not ready in 120 s:\n{self.log.read_text()}")

    def variant(self) -> str:
        found = re.search(r"llama\.cpp CPU backend variant=(\w+)", strip_ansi(self.log.read_text()))
        assert found, self.log.read_text()
        return found.group(1)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)
        shutil.rmtree(self.data, ignore_errors=True)


def strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def metrics_labels(port: int) -> dict[str, str]:
    """The labels of `gantry_cpu_backend_info`."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    line = next((l for l in text.splitlines() if l.startswith("gantry_cpu_backend_info{")), None)
    assert line, text
    return dict(re.findall(r'(\w+)="([^"]*)"', line))


def metrics_variant(port: int) -> str:
    labels = metrics_labels(port)
    assert "variant" in labels, labels
    return labels["variant"]


def chat(port: int, content: str = "Say hi.", max_tokens: int = 8) -> openai.types.chat.ChatCompletion:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY)
    return client.chat.completions.create(model=MODEL.stem, messages=[{"role": "user", "content": content}],
                                          max_tokens=max_tokens, temperature=0)


def test_the_best_variant_this_cpu_runs_is_chosen_and_named():
    shipped = sorted(p.name[len("libggml-cpu-"):-len(".so")] for p in Path(PORTABLE).glob("libggml-cpu-*.so"))
    assert set(shipped) == set(VARIANTS), f"the build ships {shipped}"
    s = Served({})
    try:
        s.wait_ready()
        chosen = s.variant()
        assert metrics_variant(s.port) == chosen
        flags = cpu_flags()
        assert VARIANTS[chosen] <= flags, f"{chosen} needs {VARIANTS[chosen] - flags}, which this CPU lacks"
        # Best: no runnable variant (AMX ones aside: the kernel may withhold AMX) does strictly more.
        better = [v for v, need in VARIANTS.items() if need <= flags and need > VARIANTS[chosen] and "amx_tile" not in need]
        assert not better, f"chose {chosen}, but this CPU runs {better}"
        reply = chat(s.port)
        assert reply.choices[0].message.content and reply.usage.completion_tokens > 0
        print(f"chose {chosen} on a CPU with {' '.join(sorted(flags & set().union(*VARIANTS.values())))}")
    finally:
        s.stop()


def test_a_cpu_offered_fewer_variants_runs_the_best_of_those():
    """Stands in for an older CPU: with only x64 and haswell on offer, haswell is chosen (this
    machine runs AVX2) and serves."""
    with tempfile.TemporaryDirectory() as only:
        for v in ("x64", "haswell"):
            shutil.copy(Path(PORTABLE) / f"libggml-cpu-{v}.so", only)
        s = Served({"GANTRY_CPU_BACKENDS_DIR": only})
        try:
            s.wait_ready()
            assert s.variant() == "haswell"
            assert metrics_variant(s.port) == "haswell"
            assert chat(s.port).usage.completion_tokens > 0
        finally:
            s.stop()


def test_no_variant_to_load_fails_at_start_with_the_reason():
    with tempfile.TemporaryDirectory() as empty:
        s = Served({"GANTRY_CPU_BACKENDS_DIR": empty})
        try:
            assert s.proc.wait(timeout=60) != 0
            log = strip_ansi(s.log.read_text())
            assert "none of the CPU backends" in log and empty in log, log
        finally:
            s.stop()


def test_gantrys_own_kernels_multiply_in_the_loaded_variant_too():
    """The one-row kernels go into the loaded variant's table, and its calls for a few rows
    (llamafile_sgemm) bind to the binary's own: both are named, and a few streams at once, which
    multiply through them, answer right."""
    from concurrent.futures import ThreadPoolExecutor

    s = Served({})
    try:
        s.wait_ready()
        labels = metrics_labels(s.port)
        assert labels.get("dot_kernels", "").startswith("gantry-avx"), labels
        assert labels.get("small_batches", "").startswith("gantry-avx"), labels
        question = "What is the capital of France? Answer in one sentence."
        with ThreadPoolExecutor(4) as pool:
            replies = list(pool.map(lambda _: chat(s.port, question, 24), range(4)))
        answers = [r.choices[0].message.content or "" for r in replies]
        assert all("Paris" in a for a in answers), answers
    finally:
        s.stop()
