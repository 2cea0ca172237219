//! SIGINT and SIGTERM as a request to stop, for the front ends: `kill`, a service manager or a logout stops a run
//! as cleanly as Ctrl-C (the current step ends and a final checkpoint is saved). The handler only counts signals
//! in an atomic; a second signal exits at once with 128 + its number. Front ends poll [`requested`] (the CLI
//! forwards it to the run's `TrainControl`, the studio closes its window through its normal exit path).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static RECEIVED: AtomicUsize = AtomicUsize::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Whether a stop signal has arrived since [`install`].
pub fn requested() -> bool {
    RECEIVED.load(Ordering::SeqCst) > 0
}

/// Install the handler for SIGINT and SIGTERM (once per process; later calls do nothing). Returns false where
/// signals are not supported.
pub fn install() -> bool {
    if INSTALLED.swap(true, Ordering::SeqCst) {
        return cfg!(unix);
    }
    #[cfg(unix)]
    {
        extern "C" fn on_stop_signal(signum: i32) {
            if RECEIVED.fetch_add(1, Ordering::SeqCst) > 0 {
                std::process::exit(128 + signum);
            }
        }
        extern "C" {
            #[link_name = "signal"]
            fn libc_signal(signum: i32, handler: extern "C" fn(i32)) -> usize;
        }
        const SIGINT: i32 = 2;
        const SIGTERM: i32 = 15;
        // SAFETY: the handler only touches an atomic counter (and exits on a second signal).
        unsafe {
            libc_signal(SIGINT, on_stop_signal);
            libc_signal(SIGTERM, on_stop_signal);
        }
        true
    }
    #[cfg(not(unix))]
    false
}

/// Call `on_stop` once, from a small background thread, when a stop signal arrives (polled every 50 ms).
pub fn forward(on_stop: impl FnOnce() + Send + 'static) {
    let spawned = std::thread::Builder::new().name("mc-signals".into()).spawn(move || {
        while !requested() {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        on_stop();
    });
    if let Err(e) = spawned {
        eprintln!("warning: cannot watch for stop signals: {e}");
    }
}
