//! The studio's side of the Hub: the worker's search and download events, and the download, cancel and token
//! actions of the pages; what the app keeps of them is [`super::HubStatus`].

use super::{Action, DownloadState, FailedDownload, StudioApp};
use crate::engine::hub::RepoKind;
use crate::studio::widgets::Tone;
use crate::worker::{Command, Event};
use std::time::Instant;

impl StudioApp {
    /// The search box a Hub search of `kind` belongs to: the model page's or the dataset page's.
    fn hub_search_panel(&mut self, kind: RepoKind) -> &mut crate::studio::hub_panel::HubPanel {
        match kind {
            RepoKind::Model => &mut self.model_panel.hub,
            RepoKind::Dataset => &mut self.dataset_panel.hub.0,
        }
    }

    pub(super) fn on_hub_event(&mut self, event: Event) {
        match event {
            Event::HubSearchResults { kind, query, hits } => self.hub_search_panel(kind).on_results(query, hits),
            Event::HubSearchFailed { kind, query, error } => {
                self.hub_search_panel(kind).on_failed(query, error.message)
            }
            Event::HubDownloadProgress { spec, progress } => {
                if let Some(d) = self.hub.download.as_mut().filter(|d| d.spec == spec) {
                    d.progress = Some(progress);
                }
            }
            Event::HubDownloadFinished { spec, kind, path, origin, note } => {
                self.hub.download = None;
                if let Some(note) = note {
                    self.toast(Tone::Info, note);
                }
                self.toast(Tone::Ok, format!("{spec} is in the cache"));
                use crate::engine::hub::RepoKind;
                let slot = origin.map(|o| (path.clone(), o));
                match kind {
                    RepoKind::Model => {
                        self.hub.model_origin = slot;
                        self.actions.push(Action::LoadModel(path));
                    }
                    RepoKind::Dataset => {
                        self.hub.data_origin = slot;
                        self.actions.push(Action::OpenDataset(path));
                    }
                }
            }
            Event::HubDownloadFailed { spec, kind, error, cancelled } => {
                self.hub.download = None;
                let tone = if cancelled { Tone::Info } else { Tone::Error };
                self.toast(
                    tone,
                    if cancelled {
                        format!("Download of {spec} cancelled")
                    } else {
                        format!("Download of {spec} failed")
                    },
                );
                self.hub.failed = Some(FailedDownload { spec, kind, message: error.message, cancelled });
            }
            _ => {}
        }
    }

    pub(super) fn run_hub_action(&mut self, action: Action) {
        match action {
            Action::Download { spec, kind } => {
                if self.hub.download.is_some() {
                    self.toast(Tone::Warn, "Another download is running; wait for it or cancel it");
                    return;
                }
                self.hub.failed = None;
                self.hub.download = Some(DownloadState {
                    spec: spec.clone(),
                    kind,
                    progress: None,
                    started: Instant::now(),
                    cancelling: false,
                });
                if kind == RepoKind::Model {
                    self.prefs.model_path = spec.clone();
                } else {
                    self.prefs.dataset_input = spec.clone();
                }
                self.worker.send(Command::HubDownload { settings: self.hub.settings.clone(), kind, spec });
            }
            Action::CancelDownload => {
                if let Some(d) = &mut self.hub.download {
                    d.cancelling = true;
                    self.worker.send(Command::CancelHubDownload);
                }
            }
            Action::SaveToken(text) => match crate::engine::hub::Token::new(&text) {
                Some(token) => match crate::engine::hub::save_token(&self.hub.settings.token_path, &token) {
                    Ok(()) => {
                        self.hub.settings.token = Some(token);
                        let path = self.hub.settings.token_path.display().to_string();
                        self.toast(Tone::Ok, format!("Token saved to {path}"));
                    }
                    Err(e) => self.toast(Tone::Error, format!("Could not save the token: {e}")),
                },
                None => self.toast(Tone::Warn, "The token is empty"),
            },
            _ => {}
        }
    }
}
