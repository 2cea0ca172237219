//! Optional fast CPU matrix multiply through a system BLAS (Intel MKL or OpenBLAS), loaded at run time.
//!
//! Candle's portable GEMM uses AVX2 kernels; OpenBLAS with its AVX-512 kernels multiplies the frozen
//! weights about twice as fast on the CPUs we measured, MKL another ~15% faster (BENCHMARKS.md). Nothing
//! links against them: we `dlopen` the first of `METAL_CANDLE_BLAS_LIB` (a path or file name), libmkl_rt,
//! libopenblas, so a machine without one (or a Mac) simply keeps Candle's GEMM. Virtual
//! machines often report a generic CPU model that makes OpenBLAS pick ancient SSE3 kernels, so unless the
//! user chose one we name the core type from the CPU's actual features before loading it.

use std::ffi::{c_char, c_int, c_void};
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
    /// The library runs single-threaded because we set it so, and we split each multiply over
    /// [`cpu_team`](crate::engine::cpu_team) ourselves. False when the user chose the library's thread count.
    split_by_team: bool,
}

// SAFETY: a function pointer into a thread-safe library.
unsafe impl Send for Blas {}
unsafe impl Sync for Blas {}

static BLAS: OnceLock<Option<Blas>> = OnceLock::new();

#[cfg(target_os = "linux")]
extern "C" {
    fn dlopen(filename: *const c_char, flag: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
}

#[cfg(target_os = "linux")]
fn load() -> Option<Blas> {
    if std::env::var_os("METAL_CANDLE_NO_BLAS").is_some() {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    if std::env::var_os("OPENBLAS_CORETYPE").is_none() {
        let core = if std::arch::is_x86_feature_detected!("avx512f") {
            Some("SkylakeX")
        } else if std::arch::is_x86_feature_detected!("avx2") {
            Some("Haswell")
        } else {
            None
        };
        if let Some(core) = core {
            // Read once by OpenBLAS when it initialises, which happens inside the dlopen below.
            std::env::set_var("OPENBLAS_CORETYPE", core);
        }
    }
    // The library's own worker threads sleep between multiplies and are woken through the kernel for each
    // one: a training step does ~1,500 multiplies, and the wake-ups (plus OpenBLAS's sched_yield spinning)
    // were a tenth of the samples in its profile. Unless the user chose a thread count, the library runs single-threaded and
    // `sgemm_operands` splits each multiply over our CPU team (cpu_team.rs), whose helpers stay awake between
    // sections. (This also avoids OpenBLAS 0.3.21's exit hang in gotoblas_quit, which needs worker threads.)
    let user_threads =
        ["OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"].iter().any(|v| std::env::var_os(v).is_some());
    if !user_threads {
        std::env::set_var("OPENBLAS_NUM_THREADS", "1");
        std::env::set_var("MKL_NUM_THREADS", "1");
    }
    if std::env::var_os("OPENBLAS_THREAD_TIMEOUT").is_none() {
        // With user-chosen threads: OpenBLAS 0.3.21's workers spin ~0.1 s after each multiply, and one that
        // goes to sleep while the process exits can miss the shutdown signal (exit then hangs in
        // gotoblas_quit). With the shortest spin they are asleep long before exit.
        std::env::set_var("OPENBLAS_THREAD_TIMEOUT", "4");
    }
    if std::env::var_os("MKL_THREADING_LAYER").is_none() {
        // MKL's default threading layer needs Intel's OpenMP runtime; GNU's is on every Linux with gcc.
        std::env::set_var("MKL_THREADING_LAYER", "GNU");
    }
    // An explicit library first, then Intel MKL (faster than OpenBLAS on the Intel CPUs we measured,
    // BENCHMARKS.md), then OpenBLAS.
    let explicit = std::env::var("METAL_CANDLE_BLAS_LIB").ok();
    let candidates: Vec<String> = match &explicit {
        Some(path) => vec![path.clone()],
        None => ["libmkl_rt.so.2", "libmkl_rt.so.3", "libmkl_rt.so", "libopenblas.so.0", "libopenblas.so"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
    };
    const RTLD_NOW: c_int = 2;
    for name in candidates {
        let Ok(c_name) = std::ffi::CString::new(name.clone()) else { continue };
        // SAFETY: plain dlopen/dlsym of a C library; the symbol has the standard CBLAS signature.
        unsafe {
            let handle = dlopen(c_name.as_ptr(), RTLD_NOW);
            if handle.is_null() {
                continue;
            }
            let sym = dlsym(handle, c"cblas_sgemm".as_ptr());
            if !sym.is_null() {
                let file = std::path::Path::new(&name).file_name().map(|f| f.to_string_lossy().into_owned());
                return Some(Blas {
                    sgemm: std::mem::transmute::<*mut c_void, SgemmFn>(sym),
                    name: file.unwrap_or(name),
                    split_by_team: !user_threads,
                });
            }
        }
    }
    None
}

#[cfg(not(target_os = "linux"))]
fn load() -> Option<Blas> {
    None
}

fn blas() -> Option<&'static Blas> {
    BLAS.get_or_init(load).as_ref()
}

/// Whether matrix multiplies on the CPU go through a BLAS library.
pub fn available() -> bool {
    blas().is_some()
}

/// The BLAS library in use (its file name), if any.
pub fn library_name() -> Option<&'static str> {
    blas().map(|b| b.name.as_str())
}

/// Load the library now (call early, before worker threads start, since it sets environment variables).
///
/// Multiplies and our own kernels run on the CPU team (cpu_team.rs); Candle's worker pool for its remaining
/// element-wise ops would only compete with it for the same cores, so unless the user chose a thread count
/// Candle's element-wise ops run on the calling thread.
pub fn init() {
    if blas().is_some()
        && std::env::var_os("CANDLE_NUM_THREADS").is_none()
        && std::env::var_os("RAYON_NUM_THREADS").is_none()
    {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
        std::env::set_var("RAYON_NUM_THREADS", "1");
    }
}

/// Below this many rows a multiply is a matrix-vector product bound by memory bandwidth (token-by-token
/// decoding): ops/gemv.rs handles one row, Candle's GEMM a few.
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
