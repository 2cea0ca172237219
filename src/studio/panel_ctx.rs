//! What the app hands every page and what a page hands back: the model's status, the context a page is drawn
//! with ([`PanelCtx`]) and the [`Action`]s it asks for. Below both the app and the pages, so that neither
//! imports the other for these.

use super::hub_status::HubStatus;
use super::prefs::{Page, Prefs};
use crate::engine::train::TrainConfig;
use crate::worker::{Command, DatasetReport, ModelSummary};
use std::path::PathBuf;
use std::time::Instant;

/// The model as the studio knows it: what is loaded, what is loading, the last load error.
#[derive(Debug, Clone, Default)]
pub struct ModelStatus {
    pub loaded: Option<ModelSummary>,
    pub loading: Option<(PathBuf, Instant)>,
    /// The loader's last progress report for the model loading.
    pub load_progress: Option<crate::engine::model::LoadProgress>,
    pub error: Option<(PathBuf, String)>,
}

/// What a page asks the app to do after it has been drawn.
#[derive(Debug, Clone)]
pub enum Action {
    Send(Command),
    Goto(Page),
    LoadModel(PathBuf),
    OpenDataset(PathBuf),
    StartTraining,
    RefreshRuns,
    OpenInChat {
        checkpoint: PathBuf,
        base_model: PathBuf,
    },
    ResumeFrom {
        checkpoint: PathBuf,
        config: Option<Box<TrainConfig>>,
    },
    /// Put a probed rank and the alpha it was probed at into the training settings.
    UseRank(Box<crate::engine::rank_probe::RankProbeResult>),
    /// Fetch a repo id into the Hugging Face cache, then load it (a model) or open it (a dataset).
    Download {
        spec: String,
        kind: crate::engine::hub::RepoKind,
    },
    CancelDownload,
    /// Store a Hub token where `huggingface_hub` keeps it.
    SaveToken(String),
}

/// What every page gets: the preferences to edit, the model status to read, and a queue for actions.
pub struct PanelCtx<'a> {
    pub prefs: &'a mut Prefs,
    pub model: &'a ModelStatus,
    pub dataset: Option<&'a DatasetReport>,
    /// The Hub settings, the running download and where Hub models and datasets came from.
    pub hub: &'a HubStatus,
    pub training_active: bool,
    /// The folder of the run in progress, if any.
    pub active_run: Option<PathBuf>,
    pub actions: &'a mut Vec<Action>,
}
