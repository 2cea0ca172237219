//! Data-parallel helpers for the CPU work we parallelise ourselves (the element-wise training kernels, the
//! head loss rows): a slice is cut into chunks and the chunks are run on [`cpu_team`], the same
//! always-awake helper threads that split BLAS multiplies and decoding's matrix-vector products.
//!
//! One set of workers matters on small machines: with a second pool (rayon's, or a BLAS library's own
//! threads) idle workers of one spin or sleep while the other's run, and they fight over the same cores.

use crate::engine::cpu_team;

/// Elements per task when splitting element-wise work: large enough that scheduling costs nothing.
pub const ELEMENTS_PER_TASK: usize = 1 << 16;

/// A raw pointer that tasks use to reach their own disjoint chunk of a buffer.
struct Shared<T>(*mut T);
unsafe impl<T: Send> Send for Shared<T> {}
unsafe impl<T: Send> Sync for Shared<T> {}

impl<T> Shared<T> {
    fn ptr(&self) -> *mut T {
        self.0
    }

    /// Chunk `index` of `chunk_len` elements of a buffer of `len` elements.
    ///
    /// # Safety
    /// Each index must be used by one task at a time, while the buffer is borrowed mutably by the caller.
    unsafe fn chunk<'a>(&self, index: usize, chunk_len: usize, len: usize) -> &'a mut [T] {
        let start = index * chunk_len;
        std::slice::from_raw_parts_mut(self.0.add(start), chunk_len.min(len - start))
    }
}

/// Run `work(index, chunk)` over `data` cut into chunks of `chunk_len`, spread over the team.
pub fn for_each_chunk<T: Send>(data: &mut [T], chunk_len: usize, work: impl Fn(usize, &mut [T]) + Sync) {
    let (len, chunk_len) = (data.len(), chunk_len.max(1));
    let shared = Shared(data.as_mut_ptr());
    // SAFETY: task i alone touches chunk i; `run` returns only after every task is done.
    cpu_team::run(len.div_ceil(chunk_len), &|i| work(i, unsafe { shared.chunk(i, chunk_len, len) }));
}

/// [`for_each_chunk`] with work that can fail: every chunk is still visited, and an error (one of them, when
/// several fail) is returned after all tasks are done.
pub fn try_for_each_chunk<T: Send, E: Send>(
    data: &mut [T],
    chunk_len: usize,
    work: impl Fn(usize, &mut [T]) -> Result<(), E> + Sync,
) -> Result<(), E> {
    let failure = std::sync::Mutex::new(None);
    for_each_chunk(data, chunk_len, |i, chunk| {
        if let Err(e) = work(i, chunk) {
            *failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
        }
    });
    match failure.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// A new buffer of `len` f32 whose chunks of `chunk_len` are filled by `work(index, chunk)` on the team.
/// Each chunk is zeroed by its own task just before `work` (cache-hot, in parallel) instead of the whole
/// buffer being zeroed up front on the calling thread.
pub fn new_f32(len: usize, chunk_len: usize, work: impl Fn(usize, &mut [f32]) + Sync) -> Vec<f32> {
    let mut out: Vec<f32> = Vec::with_capacity(len);
    for_each_chunk(&mut out.spare_capacity_mut()[..len], chunk_len, |i, chunk| {
        chunk.iter_mut().for_each(|x| {
            x.write(0.0);
        });
        // SAFETY: every element of the chunk was just initialised.
        work(i, unsafe { &mut *(chunk as *mut [std::mem::MaybeUninit<f32>] as *mut [f32]) })
    });
    // SAFETY: the chunks cover all `len` elements, each initialised above.
    unsafe { out.set_len(len) };
    out
}

/// Two new buffers of `len` f32 filled together, chunk by chunk, as in [`new_f32`].
pub fn new_f32_pair(
    len: usize,
    chunk_len: usize,
    work: impl Fn(usize, &mut [f32], &mut [f32]) + Sync,
) -> (Vec<f32>, Vec<f32>) {
    let mut second: Vec<f32> = Vec::with_capacity(len);
    let shared = Shared(second.as_mut_ptr());
    let chunk_len = chunk_len.max(1);
    let first = new_f32(len, chunk_len, |i, a| {
        // SAFETY: task i alone writes chunk i of `second`, whose capacity is `len`; zeroed before use.
        let b = unsafe { shared.chunk(i, chunk_len, len) };
        b.iter_mut().for_each(|x| *x = 0.0);
        work(i, a, b)
    });
    // SAFETY: every chunk of `second` was written above.
    unsafe { second.set_len(len) };
    (first, second)
}

/// A new buffer of `len` f32 made of rows of `row_len`, row `r` filled by `work(r, row)`; rows are grouped so
/// that a task handles about [`ELEMENTS_PER_TASK`] elements.
pub fn new_f32_rows(len: usize, row_len: usize, work: impl Fn(usize, &mut [f32]) + Sync) -> Vec<f32> {
    let row_len = row_len.max(1);
    let rows_per_task = (ELEMENTS_PER_TASK / row_len).max(1);
    new_f32(len, rows_per_task * row_len, |task, block| {
        for (i, row) in block.chunks_exact_mut(row_len).enumerate() {
            work(task * rows_per_task + i, row);
        }
    })
}

/// `f(index, chunk)` for each chunk of `data`, collected in order.
pub fn map_chunks<T: Send, R: Send + Default + Clone>(
    data: &mut [T],
    chunk_len: usize,
    f: impl Fn(usize, &mut [T]) -> R + Sync,
) -> Vec<R> {
    let chunk_len = chunk_len.max(1);
    let mut results = vec![R::default(); data.len().div_ceil(chunk_len)];
    let out = Shared(results.as_mut_ptr());
    // SAFETY: task i writes only results[i].
    for_each_chunk(data, chunk_len, |i, chunk| unsafe { *out.ptr().add(i) = f(i, chunk) });
    results
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_buffer_once_in_order() {
        let mut data: Vec<usize> = vec![0; 1000];
        for_each_chunk(&mut data, 64, |i, c| c.iter_mut().for_each(|x| *x += i + 1));
        assert!(data.iter().enumerate().all(|(j, &x)| x == j / 64 + 1));
        let (a, b) = new_f32_pair(130, 7, |i, x, y| {
            x.iter_mut().for_each(|v| *v = i as f32);
            y.iter_mut().for_each(|v| *v = -(i as f32));
        });
        assert!((0..130).all(|j| a[j] == (j / 7) as f32 && b[j] == -a[j]));
        assert_eq!(
            new_f32(10, 3, |i, c| c.iter_mut().for_each(|v| *v += i as f32)),
            [0., 0., 0., 1., 1., 1., 2., 2., 2., 3.]
        );
        let sums = map_chunks(&mut data, 100, |_, c| c.iter().sum::<usize>());
        assert_eq!(sums.len(), 10);
        assert_eq!(sums.iter().sum::<usize>(), data.iter().sum::<usize>());
    }
}
