//! The CPU's one team of worker threads: every parallel section we run (decoding's matrix-vector products,
//! about 200 per token; the parts of each BLAS multiply; the element-wise training kernels) runs here.
//!
//! Rayon's workers go to sleep on a futex once idle; waking them costs tens of microseconds per section,
//! which at decoding's pace was an eighth of the time. Here the calling thread takes tasks itself and the
//! helpers spin on an atomic for a few milliseconds after each section before they park, so a section
//! that follows soon after starts at once. One section runs at a time; a caller that finds the team busy
//! (another thread decoding or training) runs its tasks alone.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long an idle helper spins before it parks.
const SPIN_BEFORE_PARK: Duration = Duration::from_millis(3);

/// Threads that share CPU work (the caller plus the helpers): the available cores, at most 16. Read once:
/// `available_parallelism` reads the cgroup's files on every call, and callers size each section by it.
pub fn threads() -> usize {
    static THREADS: OnceLock<usize> = OnceLock::new();
    *THREADS.get_or_init(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).clamp(1, 16))
}

/// The work of one section: task index -> ().
type Task<'a> = dyn Fn(usize) + Sync + 'a;

/// The team's state word: generation, task count and next unclaimed task, changed only as a whole so that
/// a claim can never pair one section's task count with another section's index.
#[derive(Clone, Copy)]
struct State(u64);

impl State {
    const INDEX_BITS: u32 = 20;
    const MAX_TASKS: usize = (1 << Self::INDEX_BITS) - 1;

    fn new(generation: u64, tasks: usize) -> Self {
        Self((generation << (2 * Self::INDEX_BITS)) | ((tasks as u64) << Self::INDEX_BITS))
    }
    fn generation(self) -> u64 {
        self.0 >> (2 * Self::INDEX_BITS)
    }
    fn tasks(self) -> usize {
        ((self.0 >> Self::INDEX_BITS) as usize) & Self::MAX_TASKS
    }
    fn next(self) -> usize {
        (self.0 as usize) & Self::MAX_TASKS
    }
}

struct Team {
    /// A [`State`].
    state: AtomicU64,
    /// Completed tasks of the current generation.
    done: AtomicUsize,
    /// Set when a task panicked on a helper; the caller re-raises it.
    panicked: AtomicBool,
    /// Points at the calling thread's `&dyn Fn` of the current section, lifetime erased. Only read by a
    /// thread that has claimed a task of the current generation, which cannot end before that task is done.
    job: AtomicPtr<()>,
    /// Held by the thread running a section.
    section: Mutex<()>,
    /// Parked helpers wait here for a new generation.
    parked: Mutex<usize>,
    wake: Condvar,
}

fn team() -> Option<&'static Team> {
    static TEAM: OnceLock<Option<&'static Team>> = OnceLock::new();
    *TEAM.get_or_init(|| {
        let helpers = threads().saturating_sub(1);
        if helpers == 0 {
            return None;
        }
        let team: &'static Team = Box::leak(Box::new(Team {
            state: AtomicU64::new(0),
            done: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            job: AtomicPtr::new(std::ptr::null_mut()),
            section: Mutex::new(()),
            parked: Mutex::new(0),
            wake: Condvar::new(),
        }));
        for i in 0..helpers {
            let spawned =
                std::thread::Builder::new().name(format!("metal-candle-cpu-{i}")).spawn(move || team.helper_loop());
            if spawned.is_err() {
                return None;
            }
        }
        Some(team)
    })
}

/// Run `work(i)` for every `i < tasks`, spread over the calling thread and the team's helpers.
pub fn run(tasks: usize, work: &(dyn Fn(usize) + Sync)) {
    let team = match team() {
        Some(team) if tasks > 1 && tasks <= State::MAX_TASKS => team,
        _ => return (0..tasks).for_each(work),
    };
    let Ok(_section) = team.section.try_lock() else {
        return (0..tasks).for_each(work);
    };
    let work_ref: &Task<'_> = work;
    team.publish(tasks, &work_ref);
    while team.claim_and_run() {}
    while team.done.load(Ordering::Acquire) < tasks {
        std::hint::spin_loop();
    }
    if team.panicked.swap(false, Ordering::AcqRel) {
        panic!("a parallel task panicked on a CPU helper thread");
    }
}

impl Team {
    /// `work` lives on the caller's stack until every task is done.
    fn publish(&self, tasks: usize, work: &&Task<'_>) {
        self.job.store(work as *const &Task<'_> as *mut (), Ordering::Relaxed);
        self.done.store(0, Ordering::Relaxed);
        let generation = State(self.state.load(Ordering::Relaxed)).generation() + 1;
        self.state.store(State::new(generation, tasks).0, Ordering::Release);
        let parked = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        if *parked > 0 {
            self.wake.notify_all();
        }
    }

    /// Claim one task of the current generation and run it; false when none is left.
    fn claim_and_run(&self) -> bool {
        loop {
            let state = State(self.state.load(Ordering::Acquire));
            let next = state.next();
            if next >= state.tasks() {
                return false;
            }
            if self.state.compare_exchange_weak(state.0, state.0 + 1, Ordering::AcqRel, Ordering::Relaxed).is_err() {
                continue;
            }
            // The section cannot end before this task is done, so the closure is alive.
            let work = self.job.load(Ordering::Relaxed) as *const &Task<'static>;
            // A panicking task still counts as done (the caller must not wait forever) and is re-raised there.
            let work = std::panic::AssertUnwindSafe(|| unsafe { (*work)(next) });
            if std::panic::catch_unwind(work).is_err() {
                self.panicked.store(true, Ordering::Release);
            }
            self.done.fetch_add(1, Ordering::Release);
            return true;
        }
    }

    fn helper_loop(&self) {
        let mut idle_since = Instant::now();
        let mut spins = 0u32;
        loop {
            if self.claim_and_run() {
                idle_since = Instant::now();
                continue;
            }
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) && idle_since.elapsed() > SPIN_BEFORE_PARK {
                self.park();
                idle_since = Instant::now();
            }
        }
    }

    /// Sleep until a section is published.
    fn park(&self) {
        let mut parked = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        let generation = State(self.state.load(Ordering::Acquire)).generation();
        *parked += 1;
        while State(self.state.load(Ordering::Acquire)).generation() == generation {
            parked = self.wake.wait(parked).unwrap_or_else(|e| e.into_inner());
        }
        *parked -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_exactly_once_across_many_sections() {
        for tasks in [0usize, 1, 2, 7, 64] {
            for _ in 0..200 {
                let hits: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
                run(tasks, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
            }
        }
    }

    /// Several threads run sections at once (all but one run theirs alone) while the helpers race to
    /// claim tasks: every task still runs once, with its own section's closure.
    #[test]
    fn concurrent_callers_never_run_another_sections_tasks() {
        std::thread::scope(|scope| {
            for caller in 0..4usize {
                scope.spawn(move || {
                    for round in 0..2000usize {
                        let tasks = 1 + (caller * 7 + round) % 13;
                        let hits: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
                        run(tasks, &|i| {
                            hits[i].fetch_add(1, Ordering::Relaxed);
                        });
                        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
                    }
                });
            }
        });
    }

    #[test]
    fn sections_after_the_helpers_parked_still_complete() {
        let sum = AtomicUsize::new(0);
        run(4, &|i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        std::thread::sleep(SPIN_BEFORE_PARK * 3);
        run(4, &|i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 12);
    }
}
