//! One small pool of worker threads, one per core, for the CPU-heavy work we parallelise ourselves: the
//! row blocks of a BLAS multiply (OpenBLAS itself runs single-threaded, see blas.rs), decoding's
//! matrix-vector products, and the fused training kernels.
//!
//! A single pool matters on small machines: two libraries each with their own spinning workers (OpenBLAS's
//! threads busy-wait with sched_yield for a while after every call) fight over the same two cores.

/// The shared pool, or None if threads cannot be started (callers then work on the calling thread).
pub fn pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: std::sync::OnceLock<Option<rayon::ThreadPool>> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads())
            .thread_name(|i| format!("metal-candle-cpu-{i}"))
            .build()
            .ok()
    })
    .as_ref()
}

/// Worker threads in the pool: the available cores, at most 16.
pub fn threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).clamp(1, 16)
}

/// Run `work(index, chunk)` over `data` split into chunks of `chunk_len`, on the pool when there is one.
pub fn for_each_chunk<T: Send>(data: &mut [T], chunk_len: usize, work: impl Fn(usize, &mut [T]) + Sync + Send) {
    use rayon::prelude::*;
    let chunk_len = chunk_len.max(1);
    match pool() {
        Some(pool) if data.len() > chunk_len => {
            pool.install(|| data.par_chunks_mut(chunk_len).enumerate().for_each(|(i, c)| work(i, c)))
        }
        _ => data.chunks_mut(chunk_len).enumerate().for_each(|(i, c)| work(i, c)),
    }
}

/// Like [`for_each_chunk`] over two equally long buffers split at the same points.
pub fn for_each_chunk_pair<T: Send>(
    a: &mut [T],
    b: &mut [T],
    chunk_len: usize,
    work: impl Fn(usize, &mut [T], &mut [T]) + Sync + Send,
) {
    use rayon::prelude::*;
    let chunk_len = chunk_len.max(1);
    match pool() {
        Some(pool) if a.len() > chunk_len => pool.install(|| {
            a.par_chunks_mut(chunk_len)
                .zip(b.par_chunks_mut(chunk_len))
                .enumerate()
                .for_each(|(i, (x, y))| work(i, x, y))
        }),
        _ => a.chunks_mut(chunk_len).zip(b.chunks_mut(chunk_len)).enumerate().for_each(|(i, (x, y))| work(i, x, y)),
    }
}

/// Elements per task when splitting element-wise work: large enough that scheduling costs nothing.
pub const ELEMENTS_PER_TASK: usize = 1 << 16;
