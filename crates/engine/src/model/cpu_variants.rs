//! Runtime CPU dispatch for the portable build (feature `cpu-variants`, `make build-portable`).
//!
//! That build compiles ggml's CPU backend once per x86 level (`libggml-cpu-x64.so`, `…-haswell`,
//! `…-icelake`, `…-zen4`, `…-sapphirerapids`, …) and links none of them into the binary; one must
//! be loaded before any model. ggml's own `ggml_backend_load_all` picks the variant with the best
//! CPUID score, which on these VMs is a crash: a Xeon reports AMX in CPUID while the kernel does not
//! grant the process the AMX tile state, and the AMX variant segfaults at its first use. It does as
//! well where the kernel grants it but GCC 12 or older built the variant: that compiler drops most
//! of the tile configuration ggml builds before loading it (scripts/native-build-flags.sh says
//! how). So Gantry scores the variants itself, skips AMX ones unless the kernel grants AMX (asked,
//! as the AMX code must, with `arch_prctl(ARCH_REQ_XCOMP_PERM)`) and the library was not built by
//! such a GCC (its `.comment` names the compilers), loads the winner, and remembers its name for
//! the log and `/metrics`.
#![allow(unsafe_code, reason = "loading ggml's CPU backend libraries (dlopen) and arch_prctl are C calls")]
// Built in every build so `make test` checks the choice; only the portable build loads a variant.
#![cfg_attr(not(feature = "cpu-variants"), allow(dead_code))]

use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
#[cfg(feature = "cpu-variants")]
use std::sync::OnceLock;

const PREFIX: &str = "libggml-cpu-";
const SUFFIX: &str = ".so";
/// Variants compiled with AMX (ggml/src/CMakeLists.txt's `ggml_add_cpu_backend_variant` list).
const AMX_VARIANTS: &[&str] = &["sapphirerapids"];

/// The variant loaded, once `load` ran: its name (`zen4`) and file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuVariant {
    pub name: String,
    pub path: PathBuf,
    pub score: i32,
}

#[cfg(feature = "cpu-variants")]
static LOADED: OnceLock<Result<CpuVariant, String>> = OnceLock::new();

/// The directory the variants are read from: `GANTRY_CPU_BACKENDS_DIR`; else the binary's own
/// directory, where `make build-portable` and the container image put them; else where this build
/// installed them (tests, and `cargo run` in the build tree).
pub fn variants_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("GANTRY_CPU_BACKENDS_DIR") {
        return Some(PathBuf::from(dir));
    }
    let beside_binary = std::env::current_exe().ok().and_then(|exe| exe.parent().map(Path::to_path_buf));
    let installed = llama_cpp_sys_2::BACKENDS_DIR.map(PathBuf::from);
    let has_variants = |dir: &PathBuf| {
        std::fs::read_dir(dir).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| e.file_name().to_str().is_some_and(|f| f.starts_with(PREFIX) && f.ends_with(SUFFIX)))
        })
    };
    beside_binary.iter().chain(installed.iter()).find(|d| has_variants(d)).cloned().or(beside_binary)
}

/// Loads the best CPU variant this machine runs (once per process) and returns it.
#[cfg(feature = "cpu-variants")]
pub fn load() -> Result<CpuVariant, String> {
    LOADED
        .get_or_init(|| {
            let dir = variants_dir().ok_or("cannot tell where the binary is to find its CPU backends")?;
            let variant = choose(&dir, amx_granted())?;
            let path = CString::new(variant.path.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
            // SAFETY: `path` is a NUL-terminated path; ggml keeps the library loaded and registered
            // for the life of the process.
            let reg = unsafe { llama_cpp_sys_2::ggml_backend_load(path.as_ptr()) };
            if reg.is_null() {
                return Err(format!("ggml could not load the CPU backend {}", variant.path.display()));
            }
            Ok(variant)
        })
        .clone()
}

/// The loaded variant, if `load` succeeded.
#[cfg(feature = "cpu-variants")]
pub fn loaded() -> Option<CpuVariant> {
    LOADED.get().and_then(|r| r.as_ref().ok().cloned())
}

/// The address of `name` as the loaded variant defines it (not as the binary may: a handle's
/// lookup searches that library and its dependencies only), if one is loaded and defines it.
#[cfg(feature = "cpu-variants")]
pub(crate) fn symbol(name: &CStr) -> Option<std::ptr::NonNull<std::os::raw::c_void>> {
    let path = CString::new(loaded()?.path.as_os_str().as_bytes()).ok()?;
    // SAFETY: RTLD_NOLOAD only finds the library ggml already loaded (and keeps it loaded, as ggml
    // does for the life of the process); dlsym reads its symbol table.
    unsafe {
        let handle = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        if handle.is_null() {
            return None;
        }
        std::ptr::NonNull::new(libc::dlsym(handle, name.as_ptr()))
    }
}

/// The variant with the highest score in `dir` (AMX ones only if `amx`); each library is opened to
/// ask its `ggml_backend_score()` (0: this CPU lacks an instruction it needs) and closed again.
fn choose(dir: &Path, amx: bool) -> Result<CpuVariant, String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read the CPU backends in {}: {e}", dir.display()))?;
    let mut best: Option<CpuVariant> = None;
    let mut seen = Vec::new();
    for entry in entries.flatten() {
        let file = entry.file_name();
        let Some(name) = file.to_str().and_then(|f| f.strip_prefix(PREFIX)).and_then(|f| f.strip_suffix(SUFFIX)) else {
            continue;
        };
        seen.push(name.to_string());
        if AMX_VARIANTS.contains(&name) && (!amx || built_by_old_gcc(&entry.path())) {
            continue;
        }
        let score = score(&entry.path())?;
        if score > 0 && best.as_ref().is_none_or(|b| score > b.score) {
            best = Some(CpuVariant { name: name.to_string(), path: entry.path(), score });
        }
    }
    best.ok_or_else(|| {
        format!(
            "none of the CPU backends in {} runs on this CPU (found: {})",
            dir.display(),
            if seen.is_empty() { "none".into() } else { seen.join(", ") }
        )
    })
}

fn score(path: &Path) -> Result<i32, String> {
    let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: dlopen/dlsym/dlclose on a ggml CPU backend library. Its score function takes no
    // arguments and only reads CPUID; nothing from the library outlives the dlclose.
    unsafe {
        let handle = libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if handle.is_null() {
            let err = libc::dlerror();
            let why =
                if err.is_null() { "unknown error".into() } else { CStr::from_ptr(err).to_string_lossy().into_owned() };
            return Err(format!("cannot open the CPU backend {}: {why}", path.display()));
        }
        let sym = libc::dlsym(handle, c"ggml_backend_score".as_ptr());
        let score = if sym.is_null() {
            0
        } else {
            let f: extern "C" fn() -> i32 = std::mem::transmute(sym);
            f()
        };
        libc::dlclose(handle);
        Ok(score)
    }
}

/// Whether GCC 12 or older compiled the library (and Clang did not): the compilers name themselves
/// in its `.comment` section ("GCC: (Debian 12.2.0-14) 12.2.0", "clang version 17.0.6"). GCC's
/// runtime objects name the system GCC in a Clang build too, hence the Clang check.
fn built_by_old_gcc(path: &Path) -> bool {
    let Ok(bytes) = std::fs::read(path) else { return false };
    compiled_by_old_gcc(&bytes)
}

fn compiled_by_old_gcc(bytes: &[u8]) -> bool {
    let strings = bytes.split(|&b| b == 0);
    let mut old_gcc = false;
    for s in strings {
        if s.starts_with(b"clang version ") || s.windows(15).any(|w| w == b" clang version ") {
            return false;
        }
        if let Some(rest) = s.strip_prefix(b"GCC: (") {
            let version = rest.rsplit(|&b| b == b' ').next().unwrap_or_default();
            let major = version.split(|&b| b == b'.').next().and_then(|m| std::str::from_utf8(m).ok());
            old_gcc |= major.and_then(|m| m.parse::<u32>().ok()).is_some_and(|m| m <= 12);
        }
    }
    old_gcc
}

/// Whether the kernel lets this process use the AMX tile registers: the request the AMX code
/// itself must make. Fails on CPUs without AMX and where the kernel or hypervisor withholds it.
fn amx_granted() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: arch_prctl with these arguments only changes this process's permitted xsave
        // features; it reads and writes no memory of ours.
        unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_without_variants_says_what_it_found() {
        let dir = tempfile_dir();
        std::fs::write(dir.join("libggml-base.so"), b"").unwrap();
        let err = choose(&dir, false).unwrap_err();
        assert!(err.contains("found: none"), "{err}");
    }

    #[test]
    fn the_amx_variant_is_skipped_unless_granted_before_it_is_even_opened() {
        let dir = tempfile_dir();
        // Not a library: opening it would fail the choice, so skipping must happen first.
        std::fs::write(dir.join("libggml-cpu-sapphirerapids.so"), b"not an ELF file").unwrap();
        let err = choose(&dir, false).unwrap_err();
        assert!(err.contains("found: sapphirerapids"), "{err}");
        let err = choose(&dir, true).unwrap_err();
        assert!(err.contains("cannot open"), "{err}");
    }

    #[test]
    fn an_amx_variant_built_by_gcc_12_is_skipped_even_where_amx_is_granted() {
        assert!(compiled_by_old_gcc(b"\x7fELF\0GCC: (Debian 12.2.0-14+deb12u1) 12.2.0\0"));
        assert!(compiled_by_old_gcc(b"GCC: (GNU) 11.4.0\0GCC: (GNU) 13.2.0\0"));
        assert!(!compiled_by_old_gcc(b"GCC: (Debian 13.3.0-1) 13.3.0\0"));
        assert!(!compiled_by_old_gcc(b"GCC: (Debian 12.2.0-14) 12.2.0\0Debian clang version 14.0.6\0"));
        assert!(!compiled_by_old_gcc(b"no compiler named here"));
        let dir = tempfile_dir();
        std::fs::write(dir.join("libggml-cpu-sapphirerapids.so"), b"GCC: (Debian 12.2.0-14) 12.2.0\0").unwrap();
        let err = choose(&dir, true).unwrap_err();
        assert!(err.contains("found: sapphirerapids"), "skipped, not opened: {err}");
    }

    /// The variants this build installed: one is chosen, and it runs here.
    #[cfg(feature = "cpu-variants")]
    #[test]
    fn this_build_loads_a_variant_that_runs_here() {
        let variant = load().unwrap_or_else(|e| panic!("{e}"));
        assert!(variant.score > 0);
        assert!(
            !AMX_VARIANTS.contains(&variant.name.as_str()) || (amx_granted() && !built_by_old_gcc(&variant.path)),
            "{variant:?}"
        );
    }

    fn tempfile_dir() -> PathBuf {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "gantry-variants-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
