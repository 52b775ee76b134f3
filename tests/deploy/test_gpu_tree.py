"""The CUDA build starts as built: `make build-gpu` leaves a target/cuda/release/ whose binary runs
without LD_LIBRARY_PATH, and scripts/install-cuda-toolkit.sh takes every NVIDIA wheel from the
CUDA release of the nvcc asked for.

The built tree itself is checked where a CUDA build exists (skipped, and said so, elsewhere;
GANTRY_SHARED_TREE names another shared-library build to check instead). The scripts that make
and check it are also run here on a small tree of the same shape, built with the C compiler, and
the toolkit installer against a PyPI served from a temporary folder.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import shutil
import stat
import subprocess
import threading
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
CHECK = SCRIPTS / "check-gpu-tree.sh"
PLACE = SCRIPTS / "place-shared-libs.sh"


def run(*args, env=None, cwd=None):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=120, env=env, cwd=cwd)


def test_built_tree_runs_without_ld_library_path():
    tree = Path(os.environ.get("GANTRY_SHARED_TREE") or ROOT / "target" / "cuda" / "release")
    if not (tree / "gantry").exists():
        pytest.skip(f"no CUDA build at {tree} (make build-gpu; GANTRY_SHARED_TREE=DIR checks another)")
    result = run(CHECK, tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "dangling" not in result.stdout


def test_make_build_gpu_places_libraries_and_sets_run_paths():
    out = run("make", "-n", "build-gpu", cwd=ROOT).stdout
    build = out.index("cargo build --release")
    assert 'CMAKE_INSTALL_RPATH="\\$ORIGIN;$cudalib"' in out
    assert "RUSTFLAGS=\"-C link-arg=-Wl,-rpath,\\$ORIGIN:$cudalib\"" in out
    assert build < out.index("scripts/place-shared-libs.sh target/cuda/release") < out.index(
        "scripts/check-gpu-tree.sh target/cuda/release"
    )


# --- A small tree shaped as llama-cpp-sys-2 leaves it --------------------------------------------

LIBS = {  # name: (version, libraries it loads)
    "ggml-base": ("0.9.4", []),
    "ggml": ("0.9.4", ["ggml-base"]),
    "llama": ("0.0.7000", ["ggml", "ggml-base"]),
}


def cc(*args):
    compiler = shutil.which("cc")
    if compiler is None:
        pytest.fail("no C compiler (cc): scripts/install-build-deps.sh installs one")
    result = run(compiler, *args)
    assert result.returncode == 0, result.stderr


def cargo_profile_dir(tmp: Path, origin: bool) -> Path:
    """A cargo profile dir after a LLAMA_BUILD_SHARED_LIBS=1 build: the CMake install in
    build/llama-cpp-sys-2-*/out/lib (libx.so -> libx.so.0 -> libx.so.0.N), its unversioned links
    hard-linked beside the binary, and the binary itself linked with $ORIGIN in its run path.
    `origin`: whether the install gave the libraries $ORIGIN (CMAKE_INSTALL_RPATH)."""
    release = tmp / "release"
    lib = release / "build" / "llama-cpp-sys-2-0123456789abcdef" / "out" / "lib"
    lib.mkdir(parents=True)
    (release / "deps").mkdir()
    (release / "examples").mkdir()
    for name, (version, loads) in LIBS.items():
        src = tmp / f"{name}.c"
        src.write_text(f"int {name.replace('-', '_')}_answer(void) {{ return 42; }}\n")
        real = f"lib{name}.so.{version}"
        # --no-as-needed keeps the libraries NEEDED though nothing of theirs is called.
        args = ["-shared", "-fPIC", "-o", lib / real, src, f"-Wl,-soname,lib{name}.so.0", f"-L{lib}", "-Wl,--no-as-needed"]
        args += [f"-l{dep}" for dep in loads]
        if origin:
            args.append("-Wl,-rpath,$ORIGIN")
        cc(*args)
        os.symlink(real, lib / f"lib{name}.so.0")
        os.symlink(f"lib{name}.so.0", lib / f"lib{name}.so")
        # llama-cpp-sys-2's build script: std::fs::hard_link of the link itself, here and in deps/.
        os.link(lib / f"lib{name}.so", release / f"lib{name}.so", follow_symlinks=False)
        for sub in ("deps", "examples"):
            os.link(lib / f"lib{name}.so", release / sub / f"lib{name}.so", follow_symlinks=False)
    main = tmp / "main.c"
    main.write_text(
        '#include <stdio.h>\nint llama_answer(void);\n'
        'int main(void) { printf("gantry 0.0.0-%d\\n", llama_answer()); return 0; }\n'
    )
    cc("-o", release / "gantry", main, f"-L{lib}", "-Wl,--no-as-needed", "-lllama", "-Wl,-rpath,$ORIGIN")
    return release


def test_tree_as_the_build_script_leaves_it_has_dangling_links(tmp_path):
    release = cargo_profile_dir(tmp_path, origin=True)
    result = run(CHECK, release)
    assert result.returncode == 1, result.stdout
    for name in LIBS:
        assert f"lib{name}.so -> lib{name}.so.0: dangling link" in result.stdout
    assert "libllama.so.0 => not found" not in result.stdout
    assert "gantry needs libllama.so.0: not found without LD_LIBRARY_PATH" in result.stdout


def test_placed_tree_runs_as_built(tmp_path):
    release = cargo_profile_dir(tmp_path, origin=True)
    placed = run(PLACE, release)
    assert placed.returncode == 0, placed.stderr
    for name, (version, _) in LIBS.items():
        assert (release / f"lib{name}.so.{version}").is_file()
        assert os.readlink(release / f"lib{name}.so.0") == f"lib{name}.so.{version}"
        # The build script's next run skips names that resolve; a dangling one makes it fail.
        for sub in ("deps", "examples"):
            assert (release / sub / f"lib{name}.so").resolve() == (release / f"lib{name}.so.{version}").resolve()
    result = run(CHECK, release)
    assert result.returncode == 0, result.stdout
    assert "ok: gantry 0.0.0-42 runs without LD_LIBRARY_PATH" in result.stdout
    assert "ok: libllama.so loads libggml.so.0 libggml-base.so.0; run path $ORIGIN" in result.stdout
    # A second placing (a rebuild) replaces the copies and leaves the tree as good.
    assert run(PLACE, release).returncode == 0
    assert run(CHECK, release).returncode == 0


def test_libraries_without_origin_in_their_run_path_fail(tmp_path):
    release = cargo_profile_dir(tmp_path, origin=False)
    assert run(PLACE, release).returncode == 0
    result = run(CHECK, release)
    assert result.returncode == 1, result.stdout
    assert "FAIL: libllama.so loads libggml.so.0 libggml-base.so.0 but its run path (none) lacks $ORIGIN" in result.stdout
    assert "FAIL: libggml.so loads libggml-base.so.0 but its run path (none) lacks $ORIGIN" in result.stdout
    assert "libggml-base.so.0: not found without LD_LIBRARY_PATH" in result.stdout
    # The library that loads nothing of the build's needs no run path.
    assert "libggml-base.so loads" not in result.stdout


def test_place_refuses_a_static_build(tmp_path):
    release = tmp_path / "release"
    release.mkdir()
    (release / "gantry").write_text("#!/bin/sh\n")
    (release / "gantry").chmod(0o755)
    result = run(PLACE, release)
    assert result.returncode == 1
    assert "not a shared build?" in result.stderr


# --- scripts/install-cuda-toolkit.sh against a PyPI in a folder ----------------------------------

MAJOR = "13"
# cuda-toolkit releases: the versions of their components (what NVIDIA released together).
TOOLKITS = {
    "13.0.1": {"nvidia-cuda-nvcc": "13.0.88", "nvidia-cuda-runtime": "13.0.88", "nvidia-cuda-crt": "13.0.88",
               "nvidia-nvvm": "13.0.88", "nvidia-cublas": "13.0.2.14", "nvidia-cuda-cccl": "13.0.85"},
    "13.0.3": {"nvidia-cuda-nvcc": "13.0.88", "nvidia-cuda-runtime": "13.0.96", "nvidia-cuda-crt": "13.0.88",
               "nvidia-nvvm": "13.0.88", "nvidia-cublas": "13.1.1.3", "nvidia-cuda-cccl": "13.0.85"},
    "13.5.0": {"nvidia-cuda-nvcc": "13.5.37", "nvidia-cuda-runtime": "13.5.37", "nvidia-cuda-crt": "13.5.37",
               "nvidia-nvvm": "13.5.37", "nvidia-cublas": "13.10.0.20", "nvidia-cuda-cccl": "13.3.5.0.6"},
}
# The file of each component wheel that says which version it came from.
MARKERS = {
    "nvidia-cuda-nvcc": "bin/nvcc",
    "nvidia-cuda-runtime": "lib/libcudart.so.13",
    "nvidia-cuda-crt": "include/crt/version",
    "nvidia-nvvm": "nvvm/version",
    "nvidia-cublas": "lib/libcublas.so.13",
    "nvidia-cuda-cccl": "include/cccl-version",
}


def wheel(path: Path, files: dict[str, tuple[str, int]]) -> dict:
    with zipfile.ZipFile(path, "w") as archive:
        for name, (text, mode) in files.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFREG | mode) << 16
            archive.writestr(info, text)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return {"packagetype": "bdist_wheel", "filename": path.name, "url": f"../../packages/{path.name}",
            "digests": {"sha256": digest}}


def fake_pypi(root: Path) -> None:
    packages = root / "packages"
    packages.mkdir(parents=True)
    releases: dict[str, dict[str, list]] = {"cuda-toolkit": {}}
    for release, pins in TOOLKITS.items():
        metadata = "Metadata-Version: 2.4\nName: cuda-toolkit\nVersion: %s\nProvides-Extra: all\n" % release
        metadata += "".join(f"Requires-Dist: {n}=={v}.*; (sys_platform == 'linux') and extra == 'all'\n" for n, v in pins.items())
        meta = wheel(packages / f"cuda_toolkit-{release}-py2.py3-none-any.whl",
                     {f"cuda_toolkit-{release}.dist-info/METADATA": (metadata, 0o644)})
        releases["cuda-toolkit"][release] = [meta]
        for name, version in pins.items():
            if version in releases.setdefault(name, {}):
                continue
            marker = MARKERS[name]
            if name == "nvidia-cuda-nvcc":
                content = (f"#!/bin/sh\necho 'Cuda compilation tools, release {MAJOR}, V{version}'\necho 'Build fake'\n", 0o755)
            else:
                content = (version, 0o644)
            files = {f"nvidia/cu{MAJOR}/{marker}": content}
            if name == "nvidia-cublas":
                files[f"nvidia/cu{MAJOR}/lib/libcublasLt.so.13"] = (version, 0o644)
            file = f"{name.replace('-', '_')}-{version}-py3-none-manylinux2014_x86_64.whl"
            releases[name][version] = [wheel(packages / file, files)]
    for name, by_version in releases.items():
        index = root / "pypi" / name
        index.mkdir(parents=True)
        (index / "json").write_text(json.dumps({"releases": by_version}))


@pytest.fixture()
def pypi(tmp_path):
    root = tmp_path / "pypi-root"
    fake_pypi(root)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join()


def install(pypi: str, cache: Path, version: str, *args: str):
    env = dict(os.environ, PYPI_URL=pypi, GANTRY_CACHE=str(cache), GANTRY_CUDA_FROM_PYPI="1", CUDA_WHEEL_VERSION=version)
    return run(SCRIPTS / "install-cuda-toolkit.sh", *args, env=env)


def test_toolkit_wheels_come_from_the_release_of_that_nvcc(pypi, tmp_path):
    result = install(pypi, tmp_path / "cache", "13.0.88")
    assert result.returncode == 0, result.stderr
    toolkit = Path(result.stdout.strip().splitlines()[-1])
    assert toolkit == tmp_path / "cache" / "cuda" / "13.0.88" / "nvidia" / f"cu{MAJOR}"
    # The newest cuda-toolkit release with that nvcc (13.0.3), not the newest cuBLAS of CUDA 13.
    expected = TOOLKITS["13.0.3"]
    for name, marker in MARKERS.items():
        if name != "nvidia-cuda-nvcc":
            assert (toolkit / marker).read_text() == expected[name], name
    assert (toolkit / "lib" / "libcublas.so").resolve() == (toolkit / "lib" / "libcublas.so.13")
    complete = (toolkit.parents[1] / ".complete").read_text().split("\n")
    assert "nvidia-cublas 13.1.1.3" in complete
    resolved = install(pypi, tmp_path / "cache", "13.0.88", "--resolve")
    assert resolved.returncode == 0, resolved.stderr
    assert "nvidia-cublas 13.1.1.3 nvidia_cublas-13.1.1.3-py3-none-manylinux2014_x86_64.whl" in resolved.stdout
    assert "cuda-toolkit 13.0.3 pins nvcc 13.0.88" in resolved.stderr


def test_toolkit_of_an_older_form_is_redone(pypi, tmp_path):
    cache = tmp_path / "cache"
    stale = cache / "cuda" / "13.0.88" / "nvidia" / f"cu{MAJOR}"
    (stale / "bin").mkdir(parents=True)
    (stale / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (stale / "bin" / "nvcc").chmod(0o755)
    (stale / "lib").mkdir()
    (stale / "lib" / "libcublas.so.13").write_text("13.10.0.20")
    (stale.parents[1] / ".complete").write_text("")
    result = install(pypi, cache, "13.0.88")
    assert result.returncode == 0, result.stderr
    assert (stale / "lib" / "libcublas.so.13").read_text() == "13.1.1.3"


def test_toolkit_for_an_nvcc_no_release_pins_fails_clearly(pypi, tmp_path):
    result = install(pypi, tmp_path / "cache", "13.0.99")
    assert result.returncode != 0
    assert "no cuda-toolkit release" in result.stderr
    assert "nvidia-cuda-nvcc==13.0.99" in result.stderr
    assert "13.0.3: nvcc 13.0.88" in result.stderr
