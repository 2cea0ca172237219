//! The bodies of the worker's long jobs. Each runs on its own thread, reports through an [`Outbox`] and ends
//! with exactly one final event. Rules (validation, dataset reports, prompt assembly) are the engine's; jobs
//! only call them and forward what they return, errors with their kind.

use super::{Event, GenerateJob, GenerationStats, ModelSummary, Msg, Outbox};
use crate::engine::data::{chat_prompt, ChatPrompt};
use crate::engine::device::{device_name, setup, DTypeChoice, DeviceChoice, Placement};
use crate::engine::estimate::ModelShape;
use crate::engine::generate::{generate, GenerateRequest};
use crate::engine::model::{load_model_reporting, BaseQuant, LoadOptions, LoadedModel};
use crate::engine::train::{run_training, ModelLimits, TrainConfig, TrainControl, TrainEvent};
use crate::engine::{ErrorInfo, Result};
use crossbeam_channel::Sender;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

pub(super) fn load_model_job(
    path: &Path,
    (device, dtype, quantize): (DeviceChoice, DTypeChoice, BaseQuant),
    out: &Outbox,
    inbox: &Sender<Msg>,
) {
    let started = Instant::now();
    let result = (|| -> Result<(LoadedModel, Placement)> {
        let placement = setup(device, dtype)?;
        let options = LoadOptions { quantize };
        let progress = load_progress_events(path, out);
        Ok((load_model_reporting(path, &placement.device, placement.dtype, &options, Some(progress))?, placement))
    })();
    match result {
        Ok((model, placement)) => {
            let mut summary = summarize_model(&model, started.elapsed().as_secs_f64());
            summary.quantize = quantize;
            summary.device_note = placement.device_note;
            summary.dtype_reason = placement.dtype_reason.to_string();
            // The dispatcher learns of the model before the front end does, so a command sent in answer to
            // `ModelLoaded` already finds it.
            let _ = inbox.send(Msg::ModelReady { path: path.to_path_buf(), model: Arc::new(model) });
            out.send(Event::ModelLoaded(Box::new(summary)));
        }
        Err(e) => {
            out.send(Event::ModelLoadFailed { path: path.to_path_buf(), error: e.into() });
        }
    }
}

/// The loader's progress reports as `ModelLoadProgress` events, at most about ten a second (and the last).
fn load_progress_events(path: &Path, out: &Outbox) -> crate::engine::model::LoadProgressFn {
    let (path, out) = (path.to_path_buf(), out.clone());
    let last = std::sync::Mutex::new(None::<Instant>);
    Arc::new(move |progress: &crate::engine::model::LoadProgress| {
        let Ok(mut last) = last.lock() else { return };
        let due = last.is_none_or(|t| t.elapsed().as_millis() >= 100);
        if due || progress.bytes_done >= progress.bytes_total {
            *last = Some(Instant::now());
            out.send(Event::ModelLoadProgress { path: path.clone(), progress: *progress });
        }
    })
}

fn summarize_model(m: &LoadedModel, load_secs: f64) -> ModelSummary {
    let c = &m.config;
    let dtype = m.model.dtype();
    ModelSummary {
        path: m.source.path().to_path_buf(),
        format: m.source.format_name().into(),
        architecture: c.architecture.as_str().into(),
        shape: ModelShape::of_model(&m.model),
        base_weights: m.model.base_storage(),
        quantize: BaseQuant::None,
        tied_embeddings: c.tie_word_embeddings,
        dtype: format!("{dtype:?}").to_lowercase(),
        dtype_reason: String::new(),
        device_note: None,
        memory_budget_bytes: crate::engine::device::memory_budget_bytes(m.model.device()),
        memory_budget_name: crate::engine::device::memory_budget_name(m.model.device()).into(),
        weights_dtype: c.weights_dtype.clone(),
        device: device_name(m.model.device()).into(),
        has_chat_template: m.chat_template.is_some(),
        eos_token_ids: m.eos_token_ids.clone(),
        load_secs,
        notes: m.notes.clone(),
    }
}

/// `config` with `checkpointing = auto` decided against the memory estimate for `base` on its device (the
/// engine's rule, as the CLI applies it).
fn with_checkpointing_decided(config: &TrainConfig, base: &LoadedModel) -> TrainConfig {
    let mut config = config.clone();
    // The plan reads the dataset to find its longest row: only worth it when it decides something.
    if config.checkpointing == crate::engine::train::config::Checkpointing::Auto {
        crate::engine::estimate::plan_run_memory(&mut config, base);
    }
    config
}

/// Where a training job's events go: to the studio, until the run's final event (later ones are dropped); the
/// final event runs `on_final` first; a studio that is gone stops the run. [`RunOutlet::end`] guarantees one final
/// event even if the run forgot it.
pub(super) struct RunOutlet<'a, F: FnOnce()> {
    out: &'a Outbox,
    control: &'a TrainControl,
    on_final: Option<F>,
    ended: bool,
    last_step: usize,
}

impl<'a, F: FnOnce()> RunOutlet<'a, F> {
    pub(super) fn new(out: &'a Outbox, control: &'a TrainControl, on_final: F) -> Self {
        Self { out, control, on_final: Some(on_final), ended: false, last_step: 0 }
    }

    pub(super) fn emit(&mut self, event: TrainEvent) {
        if self.ended {
            return;
        }
        match &event {
            TrainEvent::Step { step, .. } => self.last_step = *step,
            TrainEvent::Finished { .. } | TrainEvent::Failed { .. } => {
                self.ended = true;
                if let Some(f) = self.on_final.take() {
                    f();
                }
            }
            _ => {}
        }
        if !self.out.send(Event::Train(event)) {
            // The front end is gone: nobody is watching this run any more.
            self.control.request_stop();
        }
    }

    /// The run returned `result`: send the final event it did not send.
    pub(super) fn end(&mut self, result: Result<()>) {
        if self.ended {
            return;
        }
        let event = match result {
            Ok(()) => TrainEvent::Finished {
                step: self.last_step,
                final_loss: None,
                final_val_loss: None,
                stopped_early: self.control.stop_requested(),
                elapsed_secs: 0.0,
                early_stop: None,
            },
            Err(e) => TrainEvent::failed(self.last_step, &e),
        };
        self.emit(event);
    }
}

/// Run a training job, forwarding its events; guarantees one final event even if the engine forgets it.
/// `on_final` runs just before the final event is sent.
pub(super) fn train_job(
    config: &TrainConfig,
    base: &LoadedModel,
    control: &TrainControl,
    out: &Outbox,
    on_final: impl FnOnce(),
) {
    let mut outlet = RunOutlet::new(out, control, on_final);
    // The engine's one settings check, against this model, before any work starts (the CLI runs the same).
    let config = &with_checkpointing_decided(config, base);
    let result = match config.validate_for_model(ModelLimits::of(&base.config)) {
        Ok(()) => run_training(config, base, control, &mut |event| outlet.emit(event)).map(|_| ()),
        Err(e) => Err(e),
    };
    outlet.end(result);
}

/// What a probe job does.
#[derive(Debug, Clone)]
pub(super) enum ProbeJob {
    /// Probe each rank on `token_budget` training tokens.
    Sweep { ranks: Vec<usize>, token_budget: usize },
    /// Time one step and one validation batch at `rank`, for the sweep's estimate.
    Calibrate { rank: usize },
}

impl ProbeJob {
    /// The event that ends this job with `error`.
    pub(super) fn failed(&self, error: crate::engine::ErrorInfo) -> Event {
        match self {
            Self::Sweep { .. } => Event::RankProbeFailed { error },
            Self::Calibrate { .. } => Event::RankCalibrationFailed { error },
        }
    }
}

pub(super) fn probe_job(
    config: &TrainConfig,
    base: &LoadedModel,
    job: &ProbeJob,
    control: &TrainControl,
    out: &Outbox,
    on_final: impl FnOnce(),
) {
    let config = &with_checkpointing_decided(config, base);
    let event = match job {
        ProbeJob::Sweep { ranks, token_budget } => {
            let result = crate::engine::rank_probe::rank_probe(base, config, ranks, *token_budget, control, &mut |r| {
                if !out.send(Event::RankProbeResult(r.clone())) {
                    control.request_stop();
                }
            });
            result.map(|results| Event::RankProbeFinished { results })
        }
        ProbeJob::Calibrate { rank } => crate::engine::rank_probe::calibrate(base, config, *rank, control)
            .map(|(plan, timing)| Event::RankProbeCalibrated { plan, timing }),
    };
    on_final();
    out.send(event.unwrap_or_else(|e| job.failed(e.into())));
}

pub(super) fn generate_job(
    job: &GenerateJob,
    base: &LoadedModel,
    cancel: &AtomicBool,
    out: &Outbox,
    on_final: impl FnOnce(),
) {
    let id = job.id;
    let result = (|| -> Result<GenerationStats> {
        // A clone shares the base weights (candle tensors are reference counted); only the adapter is new.
        let adapted;
        let mut adapter_warning = None;
        let model = match &job.adapter {
            Some(dir) => {
                adapter_warning = crate::engine::checkpoint::base_mismatch(dir, base)?;
                let mut m = base.model.clone();
                crate::engine::checkpoint::load_adapter(&mut m, dir)?;
                adapted = m;
                &adapted
            }
            None => &base.model,
        };
        let ChatPrompt { ids: prompt_ids, warning: template_warning } = chat_prompt(base, &job.messages)?;
        out.send(Event::GenerationStarted { id, prompt_tokens: prompt_ids.len(), adapter_warning, template_warning });
        let request = GenerateRequest {
            prompt_ids,
            max_new_tokens: job.max_new_tokens.max(1),
            sampling: job.sampling.clone(),
            eos_token_ids: base.eos_token_ids.clone(),
            ignore_eos: false,
            stop_strings: Vec::new(),
        };
        let output = generate(model, &base.tokenizer, &request, &mut |text| {
            !cancel.load(Ordering::SeqCst) && out.send(Event::Token { id, text: text.to_string() })
        })?;
        Ok(GenerationStats {
            prompt_tokens: output.prompt_ids.len(),
            new_tokens: output.generated_ids.len(),
            prefill_secs: output.prefill_secs,
            decode_secs: output.decode_secs,
            stop_reason: output.stop_reason,
        })
    })();
    on_final();
    match result {
        Ok(stats) => out.send(Event::GenerationFinished { id, stats }),
        Err(e) => out.send(Event::GenerationFailed { id, error: ErrorInfo::from(e) }),
    };
}
