//! Optional fast CPU matrix multiply through a system BLAS (Intel MKL or OpenBLAS), loaded at run time.
//!
//! Candle's portable GEMM uses AVX2 kernels; OpenBLAS with its AVX-512 kernels multiplies the frozen
//! weights about twice as fast on the CPUs we measured, MKL another ~15% faster (BENCHMARKS.md). Nothing
//! links against them: we `dlopen` the library the [runtime options](crate::engine::runtime) name, else the
//! first of libmkl_rt and libopenblas the loader finds, so a machine without one (or a Mac) simply keeps
//! Candle's GEMM.
//!
//! Threads are set through the libraries' own APIs, never through environment variables (the engine writes
//! none): unless the user configured the library's threads, it is made single-threaded right after loading
//! (`MKL_Set_Num_Threads` / `openblas_set_num_threads`) and each multiply is split over our CPU team instead.
//! OpenBLAS starts its worker threads inside `dlopen`; we stop them again at once (`blas_thread_shutdown_`,
//! what OpenBLAS itself does before a `fork`), so that no OpenBLAS thread is left for its exit handler
//! (`gotoblas_quit`) to join: OpenBLAS 0.3.21 could hang there at process exit when a worker was going to
//! sleep (docs/ENGINE.md, Traps).
//!
//! OpenBLAS picks its kernels inside `dlopen` from the CPU model, and only the environment
//! (`OPENBLAS_CORETYPE`) can override that choice. Some virtual machines report a CPU model OpenBLAS does not
//! know, and it falls back to kernels several times slower; we cannot change that after loading, so
//! [`core_advice`] says so and names the variable to set.

use std::ffi::c_int;
#[cfg(target_os = "linux")]
use std::ffi::{c_char, c_void};
use std::sync::OnceLock;

type SgemmFn = unsafe extern "C" fn(
    order: c_int,
    trans_a: c_int,
    trans_b: c_int,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: f32,
    a: *const f32,
    lda: c_int,
    b: *const f32,
    ldb: c_int,
    beta: f32,
    c: *mut f32,
    ldc: c_int,
);

const ROW_MAJOR: c_int = 101;
const NO_TRANS: c_int = 111;
const TRANS: c_int = 112;

struct Blas {
    sgemm: SgemmFn,
    /// The library's file name as loaded.
    name: String,
    /// OpenBLAS's kernel family (`openblas_get_corename`), e.g. "Haswell"; None for other libraries.
    core: Option<String>,
    /// The library runs single-threaded because we set it so, and we split each multiply over
    /// [`cpu_team`](crate::engine::cpu_team) ourselves. False when the user chose the library's thread count.
    split_by_team: bool,
}

// SAFETY: a function pointer into a thread-safe library.
unsafe impl Send for Blas {}
unsafe impl Sync for Blas {}

/// The library loaded (None: Candle's GEMM), and why a library the user named could not be.
type Loaded = (Option<Blas>, Option<String>);

static BLAS: OnceLock<Loaded> = OnceLock::new();

#[cfg(target_os = "linux")]
extern "C" {
    fn dlopen(filename: *const c_char, flag: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    fn dlerror() -> *const c_char;
}

#[cfg(target_os = "linux")]
fn load() -> Loaded {
    use crate::engine::runtime::BlasLibrary;
    let options = &crate::engine::runtime::options().blas;
    // An explicit library first, then Intel MKL (faster than OpenBLAS on the Intel CPUs we measured,
    // BENCHMARKS.md), then OpenBLAS.
    let candidates: Vec<String> = match &options.library {
        BlasLibrary::Off => return (None, None),
        // A library the user named loads, or the reason it does not is kept for `init` to refuse.
        BlasLibrary::Path(path) => {
            return match open(path.to_string_lossy().into_owned(), options) {
                Ok(blas) => (Some(blas), None),
                Err(why) => (None, Some(why)),
            }
        }
        BlasLibrary::Auto => ["libmkl_rt.so.2", "libmkl_rt.so.3", "libmkl_rt.so", "libopenblas.so.0", "libopenblas.so"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
    };
    (candidates.into_iter().find_map(|name| open(name, options).ok()), None)
}

/// `dlopen` one candidate and set its threads; why not when it does not load or has no `cblas_sgemm`.
#[cfg(target_os = "linux")]
fn open(name: String, options: &crate::engine::runtime::BlasOptions) -> Result<Blas, String> {
    const RTLD_NOW: c_int = 2;
    let c_name = std::ffi::CString::new(name.clone()).map_err(|_| "the name holds a NUL byte".to_string())?;
    // SAFETY: plain dlopen/dlsym of a C library; each symbol is cast to its documented C signature; dlerror's
    // message is copied at once, before any other dl call can replace it.
    unsafe {
        let handle = dlopen(c_name.as_ptr(), RTLD_NOW);
        if handle.is_null() {
            let why = dlerror();
            return Err(if why.is_null() {
                "the dynamic loader could not load it".to_string()
            } else {
                std::ffi::CStr::from_ptr(why).to_string_lossy().into_owned()
            });
        }
        let sym = dlsym(handle, c"cblas_sgemm".as_ptr());
        if sym.is_null() {
            return Err("it loads but exports no `cblas_sgemm`: not a CBLAS library".to_string());
        }
        set_threads(handle, options);
        let core = symbol::<unsafe extern "C" fn() -> *const c_char>(handle, c"openblas_get_corename")
            .map(|f| f())
            .filter(|p| !p.is_null())
            .map(|p| std::ffi::CStr::from_ptr(p).to_string_lossy().trim().to_string());
        let file = std::path::Path::new(&name).file_name().map(|f| f.to_string_lossy().into_owned());
        Ok(Blas {
            sgemm: std::mem::transmute::<*mut c_void, SgemmFn>(sym),
            name: file.unwrap_or(name),
            core,
            split_by_team: !options.library_threads,
        })
    }
}

/// A function of the library, if it exports `name`.
///
/// # Safety
/// `F` must be the symbol's C function type, and `handle` a live `dlopen` handle.
#[cfg(target_os = "linux")]
unsafe fn symbol<F: Copy>(handle: *mut c_void, name: &std::ffi::CStr) -> Option<F> {
    let sym = dlsym(handle, name.as_ptr());
    (!sym.is_null()).then(|| std::mem::transmute_copy::<*mut c_void, F>(&sym))
}

/// Choose MKL's threading layer, and make the library single-threaded unless the user chose its threads.
///
/// The library's own worker threads sleep between multiplies and are woken through the kernel for each one: a
/// training step does ~1,500 multiplies, and the wake-ups (plus OpenBLAS's sched_yield spinning) were a tenth
/// of the samples in its profile. Single-threaded, with each multiply split over our CPU team (cpu_team.rs),
/// whose helpers stay awake between sections, they cost nothing.
///
/// # Safety
/// `handle` must be a live `dlopen` handle of a BLAS library on which no other call has run yet.
#[cfg(target_os = "linux")]
unsafe fn set_threads(handle: *mut c_void, options: &crate::engine::runtime::BlasOptions) {
    type SetInt = unsafe extern "C" fn(c_int) -> c_int;
    type SetVoid = unsafe extern "C" fn(c_int);
    // MKL's default threading layer needs Intel's OpenMP runtime; GNU's is on every Linux with gcc. It must be
    // chosen before any other MKL call.
    const MKL_THREADING_GNU: c_int = 3;
    if !options.mkl_threading_layer_chosen {
        if let Some(set_layer) = symbol::<SetInt>(handle, c"MKL_Set_Threading_Layer") {
            set_layer(MKL_THREADING_GNU);
        }
    }
    if options.library_threads {
        return;
    }
    if let Some(set) = symbol::<SetVoid>(handle, c"MKL_Set_Num_Threads") {
        set(1);
    }
    if let Some(set) = symbol::<SetVoid>(handle, c"openblas_set_num_threads") {
        set(1);
        // OpenBLAS started its worker threads inside dlopen; single-threaded it never uses them. Stop them now,
        // while nothing else runs in the library, so none is left for its exit handler to join.
        if let Some(shutdown) = symbol::<unsafe extern "C" fn() -> c_int>(handle, c"blas_thread_shutdown_") {
            shutdown();
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn load() -> Loaded {
    match &crate::engine::runtime::options().blas.library {
        crate::engine::runtime::BlasLibrary::Path(_) => {
            (None, Some("a BLAS library is loaded on Linux only; here the CPU uses Candle's GEMM".into()))
        }
        _ => (None, None),
    }
}

fn blas() -> Option<&'static Blas> {
    BLAS.get_or_init(load).0.as_ref()
}

/// Whether matrix multiplies on the CPU go through a BLAS library.
pub fn available() -> bool {
    blas().is_some()
}

/// The BLAS library in use (its file name), if any.
pub fn library_name() -> Option<&'static str> {
    blas().map(|b| b.name.as_str())
}

/// OpenBLAS's kernel family (e.g. "Haswell", "SkylakeX", "Zen"), when OpenBLAS is the library in use.
pub fn core_name() -> Option<&'static str> {
    blas().and_then(|b| b.core.as_deref())
}

/// When OpenBLAS picked kernels older than the CPU supports (an unrecognised CPU model, common in virtual
/// machines), what the user can do about it: only `OPENBLAS_CORETYPE`, read by OpenBLAS when it loads, can
/// change the choice, and the engine never sets environment variables.
pub fn core_advice() -> Option<String> {
    let core = core_name()?;
    let wanted = best_openblas_core()?;
    let lower = core.to_ascii_lowercase();
    let fine: &[&str] = match wanted {
        "SkylakeX" => &["skylakex", "cooperlake", "sapphirerapids"],
        _ => &["haswell", "zen", "skylakex", "cooperlake", "sapphirerapids", "excavator"],
    };
    (!fine.contains(&lower.as_str())).then(|| {
        format!(
            "OpenBLAS chose its {core} kernels on a CPU with {}; start metal-candle with OPENBLAS_CORETYPE={wanted} \
             for several times faster CPU multiplies",
            if wanted == "SkylakeX" { "AVX-512" } else { "AVX2" }
        )
    })
}

/// The OpenBLAS kernel family this CPU's features allow, if it is one we know to be fast.
fn best_openblas_core() -> Option<&'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return Some("SkylakeX");
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            return Some("Haswell");
        }
    }
    None
}

/// Load the library now, so that its one-time start-up (and any failure to find one) happens before the first
/// multiply rather than inside it. Call after [`runtime::init`](crate::engine::runtime::init). A library the
/// runtime options name (`--blas PATH`) that does not load is refused here, naming the path and why, rather
/// than left for Candle's GEMM to stand in without a word; `auto` finding none is not an error.
pub fn init() -> crate::engine::error::Result<()> {
    let (_, failure) = BLAS.get_or_init(load);
    let (Some(why), crate::engine::runtime::BlasLibrary::Path(path)) =
        (failure, &crate::engine::runtime::options().blas.library)
    else {
        return Ok(());
    };
    Err(crate::engine::error::Error::InvalidSetting(format!(
        "the BLAS library {} (--blas, or METAL_CANDLE_BLAS_LIB) cannot be used: {why}; name a CBLAS library \
         such as libopenblas.so.0 or libmkl_rt.so, or use --blas auto (the first one installed) or --blas off",
        path.display()
    )))
}

/// Below this many rows a multiply is a matrix-vector product bound by memory bandwidth (token-by-token
/// decoding): ops/cpu/gemv.rs handles one row, Candle's GEMM a few.
pub const MIN_ROWS: usize = 8;

/// `c (m, n) = a (m, k) · op(b)` with row-major contiguous buffers, where `op(b)` is `b^T` for `b` stored
/// (n, k) when `b_transposed`, else `b` stored (k, n). Returns false when no BLAS is loaded.
pub fn sgemm(a: &[f32], b: &[f32], c: &mut [f32], m: usize, n: usize, k: usize, b_transposed: bool) -> bool {
    if c.len() < m * n {
        return false;
    }
    // SAFETY: c holds at least m * n initialised elements.
    unsafe { sgemm_raw(a, b, c.as_mut_ptr(), m, n, k, b_transposed) }
}

/// [`sgemm`] into a new buffer, without first zeroing it (OpenBLAS with beta = 0 never reads `c`).
pub fn sgemm_to_vec(a: &[f32], b: &[f32], m: usize, n: usize, k: usize, b_transposed: bool) -> Option<Vec<f32>> {
    let mut c = Vec::with_capacity(m * n);
    // SAFETY: the buffer has capacity m * n; on success every element has been written, so the length is set.
    unsafe {
        if !sgemm_raw(a, b, c.as_mut_ptr(), m, n, k, b_transposed) {
            return None;
        }
        c.set_len(m * n);
    }
    Some(c)
}

/// # Safety
/// `c` must be valid for writing `m * n` floats.
unsafe fn sgemm_raw(a: &[f32], b: &[f32], c: *mut f32, m: usize, n: usize, k: usize, b_transposed: bool) -> bool {
    if a.len() < m * k || b.len() < n * k {
        return false;
    }
    let ldb = if b_transposed { k } else { n };
    let op_a = Operand { data: a, transposed: false, ld: k };
    sgemm_operands(op_a, Operand { data: b, transposed: b_transposed, ld: ldb }, c, m, n, k)
}

/// One matrix operand of a product: row-major with leading dimension `ld`, used as is or transposed.
#[derive(Clone, Copy)]
pub struct Operand<'a> {
    pub data: &'a [f32],
    pub transposed: bool,
    pub ld: usize,
}

/// `c (m, n) = op(a) (m, k) · op(b) (k, n)`, `c` row-major contiguous.
///
/// # Safety
/// `c` must be valid for writing `m * n` floats, and each operand's data must cover its `ld`-strided rows.
pub unsafe fn sgemm_operands(a: Operand, b: Operand, c: *mut f32, m: usize, n: usize, k: usize) -> bool {
    let Some(blas) = blas() else { return false };
    if m.max(n).max(k).max(a.ld).max(b.ld) > c_int::MAX as usize {
        return false;
    }
    let parts = if blas.split_by_team { crate::engine::cpu_team::threads() } else { 1 };
    // Split the larger output dimension, so that each part re-packs only the smaller operand.
    let (split_rows, extent) = if m >= n { (true, m) } else { (false, n) };
    let parts = parts.min(extent / MIN_ROWS_PER_PART).max(1);
    // Each part re-packs the smaller operand: beyond two parts, keep parts wide enough that multiplying, not
    // packing, dominates (matters on many-core machines and narrow outputs).
    let parts = if parts > 2 { parts.min((extent / WIDE_PART).max(2)) } else { parts };
    if parts == 1 {
        call(blas, a, b, c, (m, n, k), n);
        return true;
    }
    let block = extent.div_ceil(parts);
    let c_addr = c as usize;
    crate::engine::cpu_team::run(parts, &|part| {
        let start = part * block;
        let len = block.min(extent - start);
        // Parts write disjoint blocks of `c`: rows start..start+len, or those columns of every row.
        let c = c_addr as *mut f32;
        if split_rows {
            let a_part = a.offset_rows(start);
            unsafe { call(blas, a_part, b, c.add(start * n), (len, n, k), n) };
        } else {
            let b_part = b.offset_cols(start);
            unsafe { call(blas, a, b_part, c.add(start), (m, len, k), n) };
        }
    });
    true
}

/// Smallest block of output rows (or columns) worth a part of its own.
const MIN_ROWS_PER_PART: usize = 32;
/// Rows (or columns) per part once a multiply is split more than two ways.
const WIDE_PART: usize = 128;

impl<'a> Operand<'a> {
    /// The operand `op(self)` (rows, cols) without its first `rows` rows.
    fn offset_rows(self, rows: usize) -> Self {
        let offset = if self.transposed { rows } else { rows * self.ld };
        Self { data: &self.data[offset..], ..self }
    }

    /// The operand `op(self)` (rows, cols) without its first `cols` columns.
    fn offset_cols(self, cols: usize) -> Self {
        let offset = if self.transposed { cols * self.ld } else { cols };
        Self { data: &self.data[offset..], ..self }
    }
}

/// One BLAS call: `c (m, n)` with leading dimension `ldc` = op(a) · op(b).
///
/// # Safety
/// As [`sgemm_operands`].
unsafe fn call(blas: &Blas, a: Operand, b: Operand, c: *mut f32, (m, n, k): (usize, usize, usize), ldc: usize) {
    let trans = |t: bool| if t { TRANS } else { NO_TRANS };
    (blas.sgemm)(
        ROW_MAJOR,
        trans(a.transposed),
        trans(b.transposed),
        m as c_int,
        n as c_int,
        k as c_int,
        1.0,
        a.data.as_ptr(),
        a.ld as c_int,
        b.data.as_ptr(),
        b.ld as c_int,
        0.0,
        c,
        ldc as c_int,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every transpose combination, for shapes split by rows, by columns and not at all, against a plain
    /// triple loop (skipped when no BLAS library is installed).
    #[test]
    fn split_products_match_a_plain_product() {
        if !available() {
            eprintln!("no BLAS library: skipped");
            return;
        }
        for (m, n, k) in [(300, 70, 33), (40, 260, 17), (5, 7, 3), (129, 129, 64)] {
            for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                let a: Vec<f32> = (0..m * k).map(|i| ((i * 37) % 11) as f32 - 5.0).collect();
                let b: Vec<f32> = (0..k * n).map(|i| ((i * 53) % 13) as f32 - 6.0).collect();
                // Element (i, j) of op(x) for x stored row-major as (rows, cols) = op(x)^T when transposed.
                let at = |x: &[f32], tr: bool, rows: usize, cols: usize, i: usize, j: usize| {
                    if tr {
                        x[j * rows + i]
                    } else {
                        x[i * cols + j]
                    }
                };
                let mut c = vec![0f32; m * n];
                let (lda, ldb) = (if ta { m } else { k }, if tb { k } else { n });
                let ok = unsafe {
                    sgemm_operands(
                        Operand { data: &a, transposed: ta, ld: lda },
                        Operand { data: &b, transposed: tb, ld: ldb },
                        c.as_mut_ptr(),
                        m,
                        n,
                        k,
                    )
                };
                assert!(ok);
                for i in 0..m {
                    for j in 0..n {
                        let want: f32 = (0..k).map(|p| at(&a, ta, m, k, i, p) * at(&b, tb, k, n, p, j)).sum();
                        assert_eq!(c[i * n + j], want, "m={m} n={n} k={k} ta={ta} tb={tb} at ({i}, {j})");
                    }
                }
            }
        }
    }
}
