"""The CUDA build starts as built: `make build-gpu` leaves a target/cuda/release/ whose binary runs
without LD_LIBRARY_PATH.

The built tree itself is checked where a CUDA build exists (skipped, and said so, elsewhere;
GANTRY_SHARED_TREE names another shared-library build to check instead). The scripts that make
and check it are also run here on a small tree of the same shape, built with the C compiler.
"""

from __future__ import annotations

import os
import shutil
import subprocess
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
        # llama-cpp-sys-2's build script: std::fs::hard_link of the link itself.
        os.link(lib / f"lib{name}.so", release / f"lib{name}.so", follow_symlinks=False)
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
