//! scripts/native-build-flags.sh: the flags that `make build` and the reference llama-server build
//! add to a -march=native build. AMX is switched off exactly when the compiler would enable it and
//! AMX code does not run here (the kernel does not grant the tile state, or the compiler drops the
//! tile configuration); the probes are replaced by fixed answers here.

use std::path::PathBuf;
use std::process::Command;

const AMX_OFF: &str = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16";

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/native-build-flags.sh")
}

/// Runs the script with `env` set (and the probe overrides of the caller's environment cleared).
fn flags(env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new("bash");
    cmd.arg(script());
    for var in ["NATIVE_FLAGS_ARCH", "NATIVE_FLAGS_CPU_AMX", "NATIVE_FLAGS_AMX_GRANTED"] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().expect("bash runs the script");
    assert!(out.status.success(), "script failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().count(), 1, "one line of flags, got {text:?}");
    text.trim().to_string()
}

#[test]
fn amx_is_switched_off_only_when_present_and_not_granted() {
    let x86 = ("NATIVE_FLAGS_ARCH", "x86_64");
    assert_eq!(flags(&[x86, ("NATIVE_FLAGS_CPU_AMX", "1"), ("NATIVE_FLAGS_AMX_GRANTED", "0")]), AMX_OFF);
    assert_eq!(flags(&[x86, ("NATIVE_FLAGS_CPU_AMX", "1"), ("NATIVE_FLAGS_AMX_GRANTED", "1")]), "");
    assert_eq!(flags(&[x86, ("NATIVE_FLAGS_CPU_AMX", "0"), ("NATIVE_FLAGS_AMX_GRANTED", "0")]), "");
    assert_eq!(flags(&[("NATIVE_FLAGS_ARCH", "aarch64"), ("NATIVE_FLAGS_CPU_AMX", "1")]), "");
}

#[test]
fn a_probe_that_cannot_be_built_switches_amx_off() {
    // The real probe, with a C++ compiler that fails: a wrongly enabled AMX path crashes, so any
    // failure of the probe must count as "AMX unusable".
    if std::env::consts::ARCH != "x86_64" {
        return;
    }
    let mut cmd = Command::new("bash");
    cmd.arg(script()).env_remove("NATIVE_FLAGS_AMX_GRANTED").env("NATIVE_FLAGS_CPU_AMX", "1").env("CXX", "false");
    let out = cmd.output().expect("bash runs the script");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8(out.stdout).unwrap().trim(), AMX_OFF);
}

#[test]
fn the_real_grant_probe_refuses_amx_where_the_kernel_has_none() {
    // With the CPU probe forced to "has AMX", the real arch_prctl probe decides. On a machine whose
    // CPU or kernel lacks AMX the request fails, so AMX must be switched off; only a host that
    // really grants XTILEDATA may keep it (then /proc/cpuinfo lists amx_tile).
    if std::env::consts::ARCH != "x86_64" {
        assert_eq!(flags(&[("NATIVE_FLAGS_CPU_AMX", "1")]), "");
        return;
    }
    let cpu_has_amx = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default().contains(" amx_tile");
    let got = flags(&[("NATIVE_FLAGS_CPU_AMX", "1")]);
    if cpu_has_amx {
        assert!(got.is_empty() || got == AMX_OFF, "{got:?}");
    } else {
        assert_eq!(got, AMX_OFF);
    }
}

#[test]
fn gcc_or_clang_let_the_explicit_no_amx_win_over_march() {
    // The flags come before ggml's -march=native on the compile line; the compiler must still
    // leave AMX off. Checked on a -march that implies AMX, whatever this host's CPU is.
    if std::env::consts::ARCH != "x86_64" {
        assert_eq!(flags(&[]), "");
        return;
    }
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let macros = |args: &[&str]| {
        let out = Command::new(&cc)
            .args(args)
            .args(["-dM", "-E", "-x", "c", "/dev/null"])
            .output()
            .expect("a C compiler (llama.cpp needs one)");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    assert!(macros(&["-march=sapphirerapids"]).contains("__AMX_TILE__"), "the compiler knows AMX");
    let mut args: Vec<&str> = AMX_OFF.split(' ').collect();
    args.push("-march=sapphirerapids");
    let off = macros(&args);
    assert!(!off.contains("__AMX_TILE__") && !off.contains("__AMX_INT8__") && !off.contains("__AMX_BF16__"), "{off}");
    assert!(off.contains("__AVX512VNNI__"), "the rest of -march stays");
}
