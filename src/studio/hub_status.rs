//! The studio's Hub state: the settings (endpoint, cache, token), the download in progress or the last one that
//! did not finish, and where the model and dataset that came from the Hub live (for run.json's origins). Plain
//! data the app keeps and the pages read.

use crate::engine::hub::{DownloadProgress, HubOrigin, HubSettings, RepoKind};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// A download in progress.
#[derive(Debug, Clone)]
pub struct DownloadState {
    pub spec: String,
    pub kind: RepoKind,
    pub progress: Option<DownloadProgress>,
    pub started: Instant,
    pub cancelling: bool,
}

/// The last download that did not finish: failed, or cancelled (then a new one resumes it).
#[derive(Debug, Clone)]
pub struct FailedDownload {
    pub spec: String,
    pub kind: RepoKind,
    pub message: String,
    pub cancelled: bool,
}

/// The studio's Hub state, kept by the app and read by the pages.
#[derive(Debug, Clone)]
pub struct HubStatus {
    pub settings: HubSettings,
    pub download: Option<DownloadState>,
    pub failed: Option<FailedDownload>,
    /// Where the model and dataset that came from the Hub live, and where they came from (for run.json).
    pub model_origin: Option<(PathBuf, HubOrigin)>,
    pub data_origin: Option<(PathBuf, HubOrigin)>,
}

impl HubStatus {
    pub fn new(settings: HubSettings) -> Self {
        Self { settings, download: None, failed: None, model_origin: None, data_origin: None }
    }

    /// The origin recorded for `path`, if it came from the Hub.
    pub fn origin_of(&self, kind: RepoKind, path: &Path) -> Option<HubOrigin> {
        let slot = match kind {
            RepoKind::Model => &self.model_origin,
            RepoKind::Dataset => &self.data_origin,
        };
        slot.as_ref().filter(|(p, _)| crate::worker::same_path(p, path)).map(|(_, o)| o.clone())
    }
}
