//! Hub jobs for the studio: a search, and one download at a time (a model or a dataset by repo id) that reports
//! its progress about ten times a second and stops when cancelled, keeping what arrived for a resume.

use super::dispatcher::Dispatcher;
use super::{Event, Msg, Outbox};
use crate::engine::hub::{self, HubClient, HubSettings, RepoKind};
use crate::engine::ErrorInfo;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a download reports its progress.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

impl Dispatcher {
    pub(super) fn hub_search(&self, settings: HubSettings, kind: RepoKind, query: String) {
        let fail_query = query.clone();
        self.spawn_fallible(
            "mc-hub-search",
            move |error| Event::HubSearchFailed { kind, query: fail_query.clone(), error },
            move |_| {
                let client = HubClient::new(settings);
                let hits = hub::search(&client, kind, &query, 30, &AtomicBool::new(false))?;
                Ok(Event::HubSearchResults { kind, query, hits })
            },
        );
    }

    pub(super) fn hub_download(&mut self, settings: HubSettings, kind: RepoKind, spec: String) {
        if self.download.is_some() {
            let error = ErrorInfo::new(
                crate::engine::ErrorKind::Setting,
                "another download is running; wait for it or cancel it",
            );
            self.out.send(Event::HubDownloadFailed { spec, kind, error, cancelled: false });
            return;
        }
        let cancel = Arc::new(AtomicBool::new(false));
        self.download = Some(cancel.clone());
        let (out, inbox, guard_inbox, fail_spec) =
            (self.out.clone(), self.inbox.clone(), self.inbox.clone(), spec.clone());
        super::dispatcher::spawn_job(
            "mc-hub-download",
            self.out.clone(),
            move |error| {
                let _ = guard_inbox.send(Msg::DownloadEnded);
                Event::HubDownloadFailed { spec: fail_spec, kind, error, cancelled: false }
            },
            move || {
                let event = download_job(settings, kind, &spec, &cancel, &out);
                let _ = inbox.send(Msg::DownloadEnded);
                out.send(event);
            },
        );
    }

    pub(super) fn cancel_download(&self) {
        if let Some(flag) = &self.download {
            flag.store(true, Ordering::SeqCst);
        }
    }
}

fn download_job(settings: HubSettings, kind: RepoKind, spec: &str, cancel: &AtomicBool, out: &Outbox) -> Event {
    let client = HubClient::new(settings);
    let mut last = Instant::now() - PROGRESS_EVERY;
    let mut report = |p: &hub::DownloadProgress| {
        if last.elapsed() >= PROGRESS_EVERY || p.files_done == p.file_count {
            last = Instant::now();
            out.send(Event::HubDownloadProgress { spec: spec.to_string(), progress: p.clone() });
        }
    };
    match hub::resolve(&client, spec, kind, &[], &mut report, cancel) {
        Ok(resolved) => Event::HubDownloadFinished {
            spec: spec.to_string(),
            kind,
            path: resolved.path,
            origin: resolved.origin,
            note: resolved.cache_note,
        },
        Err(e) => Event::HubDownloadFailed {
            spec: spec.to_string(),
            kind,
            cancelled: matches!(e, crate::engine::Error::Cancelled),
            error: (&e).into(),
        },
    }
}
