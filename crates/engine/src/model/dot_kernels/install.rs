//! Writing the kernels into ggml's table, and their C entry points.

use std::os::raw::{c_int, c_void};

use llama_cpp_sys_2::{
    ggml_type, ggml_type_traits_cpu, GGML_TYPE_IQ4_XS, GGML_TYPE_Q4_0, GGML_TYPE_Q4_K, GGML_TYPE_Q5_0, GGML_TYPE_Q5_K,
    GGML_TYPE_Q6_K, GGML_TYPE_Q8_0, GGML_TYPE_Q8_K,
};

use gantry_cpu_kernels::x86::{
    avxvnni, v3, v4, BlockIQ4XS, BlockQ4, BlockQ4K, BlockQ5, BlockQ5K, BlockQ6K, BlockQ8, BlockQ8K, QK, QK_K,
};

/// ggml's `ggml_vec_dot_t`: `s[0] = x · y` over `n` values; `bs`, `bx`, `by` and `nrc` only
/// matter for kernels that compute several rows at once, which these types do not on x86 (their
/// table entries say one row, `nrows = 1`, and that is left as it is).
pub(super) type VecDot =
    unsafe extern "C" fn(c_int, *mut f32, usize, *const c_void, usize, *const c_void, usize, c_int);

/// A feature level of Gantry's kernels: AVX-512 with VNNI; AVX2 with FMA, F16C and AVX-VNNI
/// (`vpdpbusd` on 256-bit registers: Intel's client cores from Alder Lake on); AVX2 with FMA and
/// F16C alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Level {
    V4,
    AvxVnni,
    V3,
}

impl Level {
    /// Every level, the fastest first.
    pub(super) const ALL: [Self; 3] = [Self::V4, Self::AvxVnni, Self::V3];

    /// The fastest level this CPU runs.
    pub(super) fn detect() -> Option<Self> {
        Self::ALL.into_iter().find(|level| level.runs_here())
    }

    /// Whether this CPU has the level's features (Zen 4 has AVX-512 VNNI but not AVX-VNNI).
    pub(super) fn runs_here(self) -> bool {
        let v3 =
            is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c");
        v3 && match self {
            Self::V4 => {
                is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
            }
            Self::AvxVnni => is_x86_feature_detected!("avxvnni"),
            Self::V3 => true,
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Self::V4 => "gantry-avx512",
            Self::AvxVnni => "gantry-avxvnni",
            Self::V3 => "gantry-avx2",
        }
    }

    /// The level's Q8_0, Q5_0 and Q4_0 kernels (each · Q8_0).
    pub(super) fn kernels(self) -> (VecDot, VecDot, VecDot) {
        match self {
            Self::V4 => (q8_0_v4, q5_0_v4, q4_0_v4),
            Self::AvxVnni => (q8_0_avxvnni, q5_0_avxvnni, q4_0_avxvnni),
            Self::V3 => (q8_0_v3, q5_0_v3, q4_0_v3),
        }
    }

    /// The level's K-quant kernels (Q4_K, Q5_K, Q6_K and IQ4_XS, each · Q8_K) with their weight
    /// types: only AVX-512 has them (with AVX2, with or without AVX-VNNI, ggml's serve, but for
    /// products of the 16-row copies, `k_quant_copies`).
    pub(super) fn k_quants(self) -> Option<[(ggml_type, VecDot); 4]> {
        match self {
            Self::V4 => Some([
                (GGML_TYPE_Q4_K, q4_k_v4),
                (GGML_TYPE_Q5_K, q5_k_v4),
                (GGML_TYPE_Q6_K, q6_k_v4),
                (GGML_TYPE_IQ4_XS, iq4_xs_v4),
            ]),
            Self::AvxVnni | Self::V3 => None,
        }
    }

    /// Whether the level has a K-quant kernel for weights of `ty` ([`Self::k_quants`]): what
    /// `small_batches` serves with Q8_K activations and `tiled` declines for it.
    pub(super) fn serves_k_quant(self, ty: ggml_type) -> bool {
        self.k_quants().is_some_and(|kernels| kernels.iter().any(|(t, _)| *t == ty))
    }

    /// The weight types the level's kernels serve at every row count ggml's repacked copies
    /// would (one activation row, a few, a prompt's ubatch): all but Q4_0 with AVX2 (AVX-VNNI or
    /// not), whose prompts past 12 rows would go to llamafile's kernels. On a 2-core Zen 5
    /// llamafile's took prompts of the 1.5B at Q4_0 at 88 tok/s where ggml's repacked AVX-512
    /// ones took 176; the AVX2 pair was not measured, so ggml keeps its copies there.
    pub(super) fn serves_without_repacking(self) -> Vec<ggml_type> {
        self.table().into_iter().map(|(ty, _)| ty).filter(|ty| self == Self::V4 || *ty != GGML_TYPE_Q4_0).collect()
    }

    /// Every kernel the level puts in ggml's table, with its weight type.
    fn table(self) -> Vec<(ggml_type, VecDot)> {
        let (q8_0, q5_0, q4_0) = self.kernels();
        [(GGML_TYPE_Q8_0, q8_0), (GGML_TYPE_Q5_0, q5_0), (GGML_TYPE_Q4_0, q4_0)]
            .into_iter()
            .chain(self.k_quants().into_iter().flatten())
            .collect()
    }
}

macro_rules! entry {
    ($name:ident, $level:ident, $dot:ident, $Block:ty) => {
        entry!($name, $level, $dot, $Block, QK, BlockQ8);
    };
    ($name:ident, $level:ident, $dot:ident, $Block:ty, $values:expr, $Activations:ty) => {
        /// # Safety
        /// ggml's `vec_dot` contract: `x` holds `n / $values` blocks of the weight type, `y` as
        /// many blocks of its activation type, `s` one float; and the CPU runs this level
        /// (checked before installing).
        unsafe extern "C" fn $name(
            n: c_int,
            s: *mut f32,
            _bs: usize,
            x: *const c_void,
            _bx: usize,
            y: *const c_void,
            _by: usize,
            _nrc: c_int,
        ) {
            let nb = usize::try_from(n).unwrap_or(0) / $values;
            // SAFETY: the contract above.
            unsafe { *s = $level::$dot(nb, x.cast::<$Block>(), y.cast::<$Activations>()) };
        }
    };
}

entry!(q8_0_v3, v3, dot_q8_0, BlockQ8);
entry!(q5_0_v3, v3, dot_q5_0, BlockQ5);
entry!(q8_0_v4, v4, dot_q8_0, BlockQ8);
entry!(q5_0_v4, v4, dot_q5_0, BlockQ5);
entry!(q4_0_v3, v3, dot_q4_0, BlockQ4);
entry!(q4_0_v4, v4, dot_q4_0, BlockQ4);
entry!(q8_0_avxvnni, avxvnni, dot_q8_0, BlockQ8);
entry!(q5_0_avxvnni, avxvnni, dot_q5_0, BlockQ5);
entry!(q4_0_avxvnni, avxvnni, dot_q4_0, BlockQ4);

entry!(q4_k_v4, v4, dot_q4_k, BlockQ4K, QK_K, BlockQ8K);
entry!(q5_k_v4, v4, dot_q5_k, BlockQ5K, QK_K, BlockQ8K);
entry!(q6_k_v4, v4, dot_q6_k, BlockQ6K, QK_K, BlockQ8K);
entry!(iq4_xs_v4, v4, dot_iq4_xs, BlockIQ4XS, QK_K, BlockQ8K);

/// ggml's own kernel for `ty` (for tests, which compare against it).
#[cfg(test)]
pub(super) fn ggml_kernel(ty: ggml_type) -> VecDot {
    // SAFETY: a pointer into ggml's static table, valid for the whole process.
    unsafe { (*traits_of(ty)).vec_dot.expect("ggml has a kernel for this type") }
}

/// Writes the kernels of `wanted` (else the fastest level this CPU runs) into ggml's table;
/// returns the level.
pub(super) fn install(wanted: Option<Level>) -> Result<Level, String> {
    let level = match wanted {
        Some(level) if level.runs_here() => level,
        Some(level) => return Err(format!("this CPU lacks the features of {}", level.name())),
        None => Level::detect().ok_or("this CPU lacks AVX2/FMA/F16C")?,
    };
    for (ty, kernel) in level.table() {
        // SAFETY: the pointer is into ggml's static table, valid for the whole process; nothing
        // computes yet (this runs before any model is loaded).
        unsafe { write_kernel(ty, kernel)? };
    }
    let quantizer = match level {
        Level::V4 => quantize_q8_k_v4,
        Level::AvxVnni | Level::V3 => quantize_q8_k_v3,
    };
    // SAFETY: as above.
    unsafe { write_quantizer(GGML_TYPE_Q8_K, quantizer)? };
    Ok(level)
}

/// ggml's kernel table entry for `ty`: through the CPU backend linked into the binary, or (the
/// portable build) the one loaded at start.
pub(super) fn traits_of_type(ty: ggml_type) -> Result<*const ggml_type_traits_cpu, String> {
    #[cfg(not(feature = "cpu-variants"))]
    // SAFETY: returns a pointer into ggml's static table for any type.
    return Ok(unsafe { llama_cpp_sys_2::ggml_get_type_traits_cpu(ty) });
    #[cfg(feature = "cpu-variants")]
    {
        let address = crate::model::cpu_variants::symbol(c"ggml_get_type_traits_cpu")
            .ok_or("no CPU backend is loaded, or it has no ggml_get_type_traits_cpu")?;
        // SAFETY: the backend's ggml_get_type_traits_cpu, with the bindings' signature.
        let get = unsafe {
            std::mem::transmute::<*mut c_void, unsafe extern "C" fn(ggml_type) -> *const ggml_type_traits_cpu>(
                address.as_ptr(),
            )
        };
        // SAFETY: as above, into that library's static table.
        Ok(unsafe { get(ty) })
    }
}

/// # Safety
/// No other thread may be changing the protection of the table's page meanwhile.
pub(super) unsafe fn write_kernel(ty: ggml_type, kernel: VecDot) -> Result<(), String> {
    let traits = traits_of_type(ty)?.cast_mut();
    // SAFETY: a field of the entry just returned; the caller's.
    unsafe { write_entry(std::ptr::addr_of_mut!((*traits).vec_dot), Some(kernel)) }
}

/// ggml's `from_float` signature: quantizes `k` floats into blocks.
pub(super) type FromFloat = unsafe extern "C" fn(*const f32, *mut c_void, i64);

/// Q8_K activations, quantized as ggml's `quantize_row_q8_K_ref` does (`gantry-cpu-kernels`'
/// `q8_k`), in ggml's calling convention: on x86 ggml runs that scalar reference itself.
pub(super) unsafe extern "C" fn quantize_q8_k_v4(x: *const f32, y: *mut c_void, k: i64) {
    // SAFETY: ggml passes `k` floats and room for their blocks; installed only with AVX-512.
    unsafe { v4::quantize_q8_k(x, y.cast::<BlockQ8K>(), usize::try_from(k).unwrap_or(0)) };
}

/// [`quantize_q8_k_v4`] with AVX2: the same bytes.
pub(super) unsafe extern "C" fn quantize_q8_k_v3(x: *const f32, y: *mut c_void, k: i64) {
    // SAFETY: ggml passes `k` floats and room for their blocks; installed where AVX2 was detected.
    unsafe { v3::quantize_q8_k(x, y.cast::<BlockQ8K>(), usize::try_from(k).unwrap_or(0)) };
}

/// # Safety
/// As [`write_kernel`]'s.
pub(super) unsafe fn write_quantizer(ty: ggml_type, quantize: FromFloat) -> Result<(), String> {
    let traits = traits_of_type(ty)?.cast_mut();
    // SAFETY: a field of the entry just returned; the caller's.
    unsafe { write_entry(std::ptr::addr_of_mut!((*traits).from_float), Some(quantize)) }
}

/// Writes `value` into `field` of ggml's constant table: its page made writable for the write,
/// then given back the protection it had.
///
/// # Safety
/// `field` is an aligned, pointer-sized field of an entry of ggml's table, and no other thread
/// may be changing the protection of its page meanwhile.
unsafe fn write_entry<T>(field: *mut T, value: T) -> Result<(), String> {
    let addr = field as usize;
    let prot = protection_of(addr).ok_or_else(|| format!("no mapping holds ggml's kernel table at {addr:#x}"))?;
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let start = addr & !(page - 1);
    let len = (addr + std::mem::size_of::<T>()).next_multiple_of(page) - start;
    let protect = |p: c_int| {
        // SAFETY: [start, start + len) lies within the mapping just found (an entry's field
        // does not cross out of its table's mapping), page-aligned.
        (unsafe { libc::mprotect(start as *mut c_void, len, p) } == 0)
            .then_some(())
            .ok_or_else(|| format!("mprotect: {}", std::io::Error::last_os_error()))
    };
    protect(prot | libc::PROT_WRITE)?;
    // SAFETY: the field is writable now and aligned (ggml_type_traits_cpu is a C struct); an
    // aligned pointer-sized store is seen whole by any thread that reads it later.
    unsafe { field.write_volatile(value) };
    protect(prot)
}

/// The protection (`PROT_*`) of the mapping holding `addr`, from /proc/self/maps.
fn protection_of(addr: usize) -> Option<c_int> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines().find_map(|line| {
        let (range, rest) = line.split_once(' ')?;
        let (from, to) = range.split_once('-')?;
        let (from, to) = (usize::from_str_radix(from, 16).ok()?, usize::from_str_radix(to, 16).ok()?);
        if !(from..to).contains(&addr) {
            return None;
        }
        let perms = rest.get(..3)?.as_bytes();
        let flag = |i: usize, c: u8, p: c_int| if perms[i] == c { p } else { 0 };
        Some(flag(0, b'r', libc::PROT_READ) | flag(1, b'w', libc::PROT_WRITE) | flag(2, b'x', libc::PROT_EXEC))
    })
}

/// ggml's type traits, for the tests' layout check.
#[cfg(test)]
pub(super) fn traits_of(ty: ggml_type) -> *const ggml_type_traits_cpu {
    traits_of_type(ty).expect("ggml's CPU backend is linked in")
}
