//! While NCCL carries the sums, the rendezvous connections carry nothing but a final goodbye, and a rank blocked in
//! a collective whose peer died would wait forever. The watchdog reads each connection on a thread of its own: a
//! goodbye ends the watch; a connection that closes (or fails) without one means that rank is gone, and the
//! watchdog records why and calls `on_lost` (which aborts the NCCL communicator, so the blocked collective returns
//! with an error that [`Links::explain`](super::rendezvous::Links::explain) turns into one naming the rank).

use super::rendezvous::{lost_reason, Links, GOODBYE};
use crate::engine::{Error, Result};
use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The watching threads; dropping this stops them reacting (a rank that has finished no longer cares).
pub struct Watchdog {
    finished: Arc<AtomicBool>,
}

impl Watchdog {
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub fn start(links: &Links, on_lost: impl Fn() + Send + Sync + 'static) -> Result<Self> {
        let finished = Arc::new(AtomicBool::new(false));
        let on_lost = Arc::new(on_lost);
        for (peer, stream) in &links.peers {
            let mut stream =
                stream.try_clone().map_err(|e| Error::Distributed(format!("watching rank {peer}: {e}")))?;
            let (peer, lost, finished, on_lost) = (*peer, links.lost.clone(), finished.clone(), on_lost.clone());
            let watch = move || {
                let mut byte = [0u8; 1];
                let how = match stream.read(&mut byte) {
                    Ok(1) if byte[0] == GOODBYE => return,
                    Ok(1) => format!("it sent an unexpected byte {:#x}", byte[0]),
                    Ok(_) => "its connection closed".to_string(),
                    Err(e) => format!("its connection failed ({e})"),
                };
                if finished.load(Ordering::SeqCst) {
                    return;
                }
                if let Ok(mut slot) = lost.lock() {
                    slot.get_or_insert(lost_reason(peer, &how));
                }
                on_lost();
            };
            std::thread::Builder::new()
                .name(format!("mc-watch-rank-{peer}"))
                .spawn(watch)
                .map_err(|e| Error::Distributed(format!("cannot start the watchdog: {e}")))?;
        }
        Ok(Self { finished })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.finished.store(true, Ordering::SeqCst);
    }
}
