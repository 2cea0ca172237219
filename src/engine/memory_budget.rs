//! A memory budget for running untrusted code: a model's chat template is a program from a stranger, and a
//! Jinja engine's step budget does not bound memory (`' ' | indent(10**11)`, or a string doubled forty times in
//! a loop, asks for terabytes in a handful of steps and aborts the process).
//!
//! [`BudgetedAlloc`] is the process's allocator: the system one, plus a count, on threads that run under a
//! budget, of the bytes they hold. [`run_with_budget`] runs a job on such a thread. An allocation that would
//! take the thread past its budget never returns: Rust cannot recover from a failed allocation (it aborts),
//! so the thread parks forever instead, holding at most its budget, and the caller, which polls, reports
//! [`BudgetError::MemoryExceeded`] and stops using that thread. Threads without a budget pay one
//! thread-local read per allocation. The same allocator also counts heap use for [`super::memory_watch`].

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The system allocator, counting bytes on threads that run under a budget.
pub struct BudgetedAlloc;

thread_local! {
    /// (bytes allocated since the budget began, less those freed; the budget, 0 for none).
    static BUDGET: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
    /// Set by a budget thread at its start: raised when it parks over budget.
    static TRIPPED: Cell<*const AtomicBool> = const { Cell::new(std::ptr::null()) };
}

fn charge(bytes: usize) {
    let over = BUDGET
        .try_with(|b| {
            let (used, limit) = b.get();
            if limit == 0 {
                return false;
            }
            let used = used.saturating_add(bytes);
            // Past the budget, stop counting first: what follows must not recurse into this branch.
            b.set(if used > limit { (used, 0) } else { (used, limit) });
            used > limit
        })
        .unwrap_or(false);
    if over {
        park_over_budget();
    }
}

fn credit(bytes: usize) {
    let _ = BUDGET.try_with(|b| {
        let (used, limit) = b.get();
        if limit != 0 {
            b.set((used.saturating_sub(bytes), limit));
        }
    });
}

/// Raise this thread's flag and sleep forever (sleeping allocates nothing).
fn park_over_budget() -> ! {
    if let Ok(flag) = TRIPPED.try_with(Cell::get) {
        // SAFETY: set by `budget_thread` from an Arc the thread itself keeps alive for as long as it lives.
        if let Some(flag) = unsafe { flag.as_ref() } {
            flag.store(true, Ordering::SeqCst);
        }
    }
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

// SAFETY: every call is forwarded to `System` unchanged; the bookkeeping touches only thread-local cells.
unsafe impl GlobalAlloc for BudgetedAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        charge(layout.size());
        super::memory_watch::on_heap_alloc(layout.size());
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        charge(layout.size());
        super::memory_watch::on_heap_alloc(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        credit(layout.size());
        super::memory_watch::on_heap_free(layout.size());
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            charge(new_size - layout.size());
            super::memory_watch::on_heap_alloc(new_size - layout.size());
        } else {
            credit(layout.size() - new_size);
            super::memory_watch::on_heap_free(layout.size() - new_size);
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Why a budgeted job gave no result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BudgetError {
    /// It asked for more memory than its budget.
    MemoryExceeded { limit_bytes: usize },
    /// It panicked.
    Panicked,
    /// No thread could be started for it.
    NoThread(String),
}

type Job = Box<dyn FnOnce() + Send>;

/// An idle thread that runs budgeted jobs, and the flag it raises when it parks over budget.
struct BudgetThread {
    jobs: crossbeam_channel::Sender<Job>,
    tripped: Arc<AtomicBool>,
}

static IDLE: Mutex<Vec<BudgetThread>> = Mutex::new(Vec::new());

fn budget_thread() -> Result<BudgetThread, BudgetError> {
    let (jobs, inbox) = crossbeam_channel::unbounded::<Job>();
    let tripped = Arc::new(AtomicBool::new(false));
    let flag = tripped.clone();
    std::thread::Builder::new()
        .name("memory-budget".into())
        .spawn(move || {
            TRIPPED.with(|t| t.set(Arc::as_ptr(&flag)));
            for job in inbox {
                job();
            }
            drop(flag);
        })
        .map_err(|e| BudgetError::NoThread(e.to_string()))?;
    Ok(BudgetThread { jobs, tripped })
}

/// Run `job` on a budget thread holding at most `limit_bytes` of memory it allocated, and wait for it.
pub fn run_with_budget<T: Send + 'static>(
    limit_bytes: usize,
    job: impl FnOnce() -> T + Send + 'static,
) -> Result<T, BudgetError> {
    let idle = IDLE.lock().ok().and_then(|mut v| v.pop());
    let thread = match idle {
        Some(t) => t,
        None => budget_thread()?,
    };
    let (reply, answer) = crossbeam_channel::bounded::<std::thread::Result<T>>(1);
    let wrapped: Job = Box::new(move || {
        BUDGET.with(|b| b.set((0, limit_bytes.max(1))));
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
        BUDGET.with(|b| b.set((0, 0)));
        let _ = reply.send(result);
    });
    if thread.jobs.send(wrapped).is_err() {
        return Err(BudgetError::NoThread("the budget thread ended".into()));
    }
    loop {
        match answer.recv_timeout(Duration::from_millis(2)) {
            Ok(result) => {
                if let Ok(mut idle) = IDLE.lock() {
                    idle.push(thread);
                }
                return result.map_err(|_| BudgetError::Panicked);
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) if thread.tripped.load(Ordering::SeqCst) => {
                return Err(BudgetError::MemoryExceeded { limit_bytes });
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return Err(BudgetError::Panicked),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_within_budget_returns_and_one_past_it_is_stopped() {
        assert_eq!(run_with_budget(1 << 20, || vec![1u8; 1000].len()), Ok(1000));
        // A request of a terabyte never reaches the system allocator.
        let huge = run_with_budget(64 << 20, || " ".repeat(1 << 40).len());
        assert_eq!(huge, Err(BudgetError::MemoryExceeded { limit_bytes: 64 << 20 }));
        // Growth by doubling is stopped at the budget, not at the machine's memory.
        let doubling = run_with_budget(64 << 20, || {
            let mut s = String::from("x");
            for _ in 0..40 {
                s = format!("{s}{s}");
            }
            s.len()
        });
        assert_eq!(doubling, Err(BudgetError::MemoryExceeded { limit_bytes: 64 << 20 }));
        // Freed memory is credited: many small jobs reuse the thread and stay within budget.
        for _ in 0..100 {
            assert_eq!(run_with_budget(1 << 20, || vec![0u8; 512 << 10].len()), Ok(512 << 10));
        }
        assert_eq!(run_with_budget(1 << 20, || -> usize { panic!("boom") }), Err(BudgetError::Panicked));
    }
}
