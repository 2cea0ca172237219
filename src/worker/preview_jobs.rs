//! Jobs that look at data before it is used: a page of a dataset's rows (paged and searched through the
//! engine's [`RowBrowser`], which is kept between requests so paging does not read the files again), and the
//! check of an adapter folder against the loaded model before the chat uses it.

use super::dispatcher::Dispatcher;
use super::Event;
use crate::engine::checkpoint::read_adapter_for;
use crate::engine::data::{ReadOptions, RowBrowser, RowQuery, RowRendering};
use crate::engine::{ErrorInfo, ErrorKind};
use std::path::PathBuf;
use std::sync::Arc;

/// What the chat needs to know of an adapter folder that fits the loaded model.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AdapterCheck {
    pub summary: crate::engine::checkpoint::AdapterSummary,
    /// The base its adapter_config.json names (`base_model_name_or_path`), if any.
    pub base_named: Option<String>,
    /// Set when the adapter names or records another base than the loaded model (it still fits its shapes).
    pub warning: Option<String>,
}

/// A page of rows to show; see [`super::Command::BrowseRows`].
#[derive(Debug, Clone, PartialEq)]
pub struct RowsRequest {
    /// Chosen by the front end; the answer carries it.
    pub id: u64,
    pub path: PathBuf,
    pub read: ReadOptions,
    pub query: RowQuery,
    pub max_seq_len: usize,
    pub train_on_prompt: bool,
}

impl Dispatcher {
    pub(super) fn browse_rows(&self, request: RowsRequest) {
        let model = self.model.as_ref().map(|(_, m)| m.clone());
        let cache = self.rows.clone();
        let (id, fail_path) = (request.id, request.path.clone());
        self.spawn_fallible(
            "mc-rows",
            move |error| Event::DatasetRowsFailed { id, path: fail_path.clone(), error },
            move |_| {
                let browser = {
                    let mut held = cache.lock().unwrap_or_else(|e| e.into_inner());
                    match held.as_ref() {
                        Some(b) if b.path == request.path && b.read == request.read && b.is_current() => b.clone(),
                        _ => {
                            // Let go of the old rows before reading the new ones: two large datasets at once
                            // would double the memory.
                            *held = None;
                            let fresh = Arc::new(RowBrowser::open(&request.path, &request.read)?);
                            *held = Some(fresh.clone());
                            fresh
                        }
                    }
                };
                let rendering = model.as_deref().map(|model| RowRendering {
                    model,
                    max_seq_len: request.max_seq_len,
                    train_on_prompt: request.train_on_prompt,
                });
                let page = browser.page(&request.query, rendering);
                Ok(Event::DatasetRows { id, page: Box::new(page) })
            },
        );
    }

    pub(super) fn check_adapter(&self, path: PathBuf) {
        let Some((_, base)) = self.model.as_ref() else {
            let error = ErrorInfo::new(
                ErrorKind::Setting,
                "load a model first (Model page): an adapter is checked against the model it will run on",
            );
            self.out.send(Event::AdapterCheckFailed { path, error });
            return;
        };
        let base = base.clone();
        let fail_path = path.clone();
        self.spawn_fallible(
            "mc-adapter-check",
            move |error| Event::AdapterCheckFailed { path: fail_path.clone(), error },
            move |_| {
                if !path.is_dir() {
                    return Err(crate::engine::Error::MissingFile {
                        path: path.clone(),
                        what: "an adapter is a folder with adapter_config.json and adapter_model.safetensors \
                               (PEFT format)"
                            .into(),
                    });
                }
                let weights = read_adapter_for(&base.config, &path)?;
                let warning = crate::engine::checkpoint::base_mismatch(&path, &base)?;
                let check = AdapterCheck {
                    summary: weights.summary,
                    base_named: weights.config.base_model_name_or_path.filter(|n| !n.trim().is_empty()),
                    warning,
                };
                Ok(Event::AdapterChecked { path, check: Box::new(check) })
            },
        );
    }
}
