//! The adapter X-ray job: `engine::xray` on its own thread (it reads the adapter and one frozen weight per
//! adapted linear), ending with `XrayReady` or `XrayFailed`.

use super::dispatcher::Dispatcher;
use super::Event;
use crate::engine::xray;
use std::path::PathBuf;

impl Dispatcher {
    pub(super) fn xray(&self, checkpoint: PathBuf) {
        let fail_path = checkpoint.clone();
        self.spawn_fallible(
            "mc-xray",
            move |error| Event::XrayFailed { checkpoint: fail_path.clone(), error },
            move |_| {
                let base = xray::find_base(&checkpoint, None);
                Ok(Event::XrayReady(Box::new(xray::inspect(&checkpoint, &base)?)))
            },
        );
    }
}
