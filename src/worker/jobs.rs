//! The bodies of the worker's long jobs. Each runs on its own thread, reports through an [`Outbox`] and ends
//! with exactly one final event.

use super::{ChatSide, DatasetReport, Event, GenerateJob, GenerationStats, Msg, Outbox, PreviewRow, SplitReport};
use super::{CheckpointSummary, ModelSummary, RunSummary, TokenStats};
use crate::engine::bench::RankProbeResult;
use crate::engine::data::{self, Row, TokenizeSpec};
use crate::engine::device::{device_name, setup, DTypeChoice, DeviceChoice, Placement};
use crate::engine::generate::{generate, GenerateRequest, StopReason};
use crate::engine::model::chat_template::ChatMessage;
use crate::engine::model::{load_model, LoadedModel};
use crate::engine::train::{run_training, TrainConfig, TrainControl, TrainEvent, ALL_TARGETS};
use crate::engine::Result;
use crossbeam_channel::Sender;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Rows tokenized for the length statistics; larger datasets are sampled from the start.
const MAX_STAT_ROWS: usize = 20_000;

pub(super) fn load_model_job(path: &Path, device: DeviceChoice, dtype: DTypeChoice, out: &Outbox, inbox: &Sender<Msg>) {
    let started = Instant::now();
    let result = (|| -> Result<(LoadedModel, Placement)> {
        let placement = setup(device, dtype)?;
        Ok((load_model(path, &placement.device, placement.dtype)?, placement))
    })();
    match result {
        Ok((model, placement)) => {
            let mut summary = summarize_model(&model, started.elapsed().as_secs_f64());
            summary.device_note = placement.device_note;
            summary.dtype_reason = placement.dtype_reason.to_string();
            // The dispatcher learns of the model before the front end does, so a command sent in answer to
            // `ModelLoaded` already finds it.
            let _ = inbox.send(Msg::ModelReady { path: path.to_path_buf(), model: Arc::new(model) });
            out.send(Event::ModelLoaded(Box::new(summary)));
        }
        Err(e) => {
            out.send(Event::ModelLoadFailed { path: path.to_path_buf(), message: e.to_string() });
        }
    }
}

fn summarize_model(m: &LoadedModel, load_secs: f64) -> ModelSummary {
    let c = &m.config;
    let dtype = m.model.dtype();
    ModelSummary {
        path: m.source.path().to_path_buf(),
        format: m.source.format_name().into(),
        architecture: c.architecture.as_str().into(),
        parameters: c.parameter_count(),
        layers: c.num_layers,
        hidden_size: c.hidden_size,
        intermediate_size: c.intermediate_size,
        attention_heads: c.num_attention_heads,
        kv_heads: c.num_kv_heads,
        head_dim: c.head_dim,
        vocab_size: c.vocab_size,
        context_length: c.max_position_embeddings,
        tied_embeddings: c.tie_word_embeddings,
        dtype: format!("{dtype:?}").to_lowercase(),
        dtype_reason: String::new(),
        device_note: None,
        dtype_bytes: dtype.size_in_bytes(),
        weights_dtype: c.weights_dtype.clone(),
        device: device_name(m.model.device()).into(),
        has_chat_template: m.chat_template.is_some(),
        eos_token_ids: m.eos_token_ids.clone(),
        linear_shapes: ALL_TARGETS
            .iter()
            .filter_map(|t| c.linear_shape(t).map(|(i, o)| (t.to_string(), i, o)))
            .collect(),
        load_secs,
    }
}

/// The files of a dataset: a single file, or a folder's train/valid/test.jsonl (mlx-lm's layout).
fn dataset_files(path: &Path) -> Result<Vec<(String, PathBuf)>> {
    use crate::engine::Error;
    if !path.exists() {
        return Err(Error::MissingFile {
            path: path.to_path_buf(),
            what: "expected a .jsonl file or a folder with train.jsonl (and optional valid.jsonl, test.jsonl)".into(),
        });
    }
    if !path.is_dir() {
        return Ok(vec![("train".into(), path.to_path_buf())]);
    }
    let mut files = Vec::new();
    for split in ["train", "valid", "test"] {
        let p = path.join(format!("{split}.jsonl"));
        if p.is_file() {
            files.push((split.to_string(), p));
        }
    }
    if files.first().map(|(s, _)| s != "train").unwrap_or(true) {
        return Err(Error::MissingFile {
            path: path.join("train.jsonl"),
            what: "a dataset folder needs train.jsonl (valid.jsonl and test.jsonl are optional)".into(),
        });
    }
    Ok(files)
}

pub(super) fn inspect_dataset(
    path: &Path,
    model: Option<&LoadedModel>,
    max_seq_len: usize,
    train_on_prompt: bool,
    preview_rows: usize,
) -> Result<DatasetReport> {
    let mut report = DatasetReport { path: path.to_path_buf(), ..Default::default() };
    let mut parsed = Vec::new();
    for (split, file) in dataset_files(path)? {
        let p = data::read_jsonl(&file)?;
        report.splits.push(SplitReport {
            split: split.clone(),
            path: file.clone(),
            format: p.format.map(|f| f.name().to_string()),
            rows: p.rows.len(),
            blank_lines: p.blank_lines,
            problems: p.problems.iter().map(|q| (q.line, q.message.clone())).collect(),
        });
        parsed.push((split, p));
    }
    if !parsed.iter().any(|(s, _)| s == "valid") {
        report.notes.push("no valid.jsonl: training holds out a fraction of the training rows for validation".into());
    }
    let Some(model) = model else {
        report.notes.push("load a model to see token counts, the length histogram and the templated preview".into());
        return Ok(report);
    };
    report.tokenizer_model = Some(model.source.path().to_path_buf());
    if model.chat_template.is_none() && parsed.iter().any(|(_, p)| p.format != Some(data::DatasetFormat::Text)) {
        report.notes.push(data::tokenize::FALLBACK_TEMPLATE_NOTE.into());
    }
    // Lengths before truncation, so the histogram can show what a shorter max_seq_len would cut.
    let full = TokenizeSpec::for_model(model, usize::MAX / 2, train_on_prompt);
    let cut = TokenizeSpec { max_seq_len: max_seq_len.max(2), ..full };
    let mut stats = TokenStats { max_seq_len, ..Default::default() };
    if let Some((_, train)) = parsed.iter().find(|(s, _)| s == "train") {
        if train.rows.len() > MAX_STAT_ROWS {
            report.notes.push(format!("token statistics from the first {MAX_STAT_ROWS} of {} rows", train.rows.len()));
        }
        for sourced in train.rows.iter().take(MAX_STAT_ROWS) {
            match data::tokenize_row(&sourced.row, &full) {
                Ok(example) => {
                    let len = example.len();
                    stats.lengths.push(len);
                    stats.total_tokens += len.min(max_seq_len);
                    stats.truncated += usize::from(len > max_seq_len);
                    let targets = example.target_mask.iter().take(max_seq_len).filter(|&&t| t).count();
                    stats.target_tokens += targets;
                    stats.dropped += usize::from(targets == 0);
                }
                Err(e) => stats.failures.push(("train".into(), sourced.line, e.to_string())),
            }
        }
    }
    report.tokens = Some(stats);
    for (split, file) in &parsed {
        for sourced in &file.rows {
            if report.preview.len() >= preview_rows {
                break;
            }
            if let Ok(preview) = preview(&sourced.row, &cut, model) {
                let (tokens, truncated, pieces) = preview;
                report.preview.push(PreviewRow { split: split.clone(), line: sourced.line, tokens, truncated, pieces });
            }
        }
    }
    Ok(report)
}

/// (tokens, truncated, pieces) of one row.
type Preview = (usize, bool, Vec<(String, bool)>);

fn preview(row: &Row, spec: &TokenizeSpec<'_>, model: &LoadedModel) -> Result<Preview> {
    let example = data::tokenize_row(row, spec)?;
    let pieces = data::preview_example(&example, &model.tokenizer)?;
    Ok((example.len(), example.truncated, pieces))
}

pub(super) fn list_runs(runs_dir: &Path) -> Result<Vec<RunSummary>> {
    let runs = crate::engine::checkpoint::list_runs(runs_dir)?;
    Ok(runs
        .into_iter()
        .map(|r| {
            let mut train_loss = Vec::new();
            let mut val_loss = Vec::new();
            let mut status = "incomplete".to_string();
            let mut total_steps = None;
            let mut trainable_params = None;
            for e in &r.events {
                match e {
                    TrainEvent::Started { total_steps: t, trainable_params: p, .. } => {
                        total_steps = Some(*t);
                        trainable_params = Some(*p);
                    }
                    TrainEvent::Step { step, loss, .. } => train_loss.push([*step as f64, *loss]),
                    TrainEvent::Eval { step, val_loss: v, .. } => val_loss.push([*step as f64, *v]),
                    TrainEvent::Finished { stopped_early, .. } => {
                        status = if *stopped_early { "stopped".into() } else { "finished".into() };
                    }
                    TrainEvent::Failed { message, .. } => status = format!("failed: {message}"),
                    _ => {}
                }
            }
            RunSummary {
                name: r.name,
                dir: r.dir,
                config: r.config,
                started_unix_secs: r.started_unix_secs,
                train_loss,
                val_loss,
                total_steps,
                trainable_params,
                status,
                checkpoints: r
                    .checkpoints
                    .into_iter()
                    .map(|c| CheckpointSummary {
                        step: c.step,
                        path: c.path,
                        size_bytes: c.size_bytes,
                        train_loss: c.train_loss,
                        val_loss: c.val_loss,
                        saved_unix_secs: c.saved_unix_secs,
                    })
                    .collect(),
            }
        })
        .collect())
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
    let mut on_final = Some(on_final);
    let ended = std::cell::Cell::new(false);
    let last_step = std::cell::Cell::new(0);
    let mut emit = |event: TrainEvent| {
        if ended.get() {
            return;
        }
        match &event {
            TrainEvent::Step { step, .. } => last_step.set(*step),
            TrainEvent::Finished { .. } | TrainEvent::Failed { .. } => {
                ended.set(true);
                if let Some(f) = on_final.take() {
                    f();
                }
            }
            _ => {}
        }
        if !out.send(Event::Train(event)) {
            // The front end is gone: nobody is watching this run any more.
            control.request_stop();
        }
    };
    let result = match config.validate() {
        Ok(()) => run_training(config, base, control, &mut emit),
        Err(e) => {
            emit(TrainEvent::Failed { step: 0, message: e.to_string() });
            Err(e)
        }
    };
    if !ended.get() {
        let event = match result {
            Ok(_) => TrainEvent::Finished {
                step: last_step.get(),
                final_loss: None,
                final_val_loss: None,
                stopped_early: control.stop_requested(),
                elapsed_secs: 0.0,
            },
            Err(e) => TrainEvent::Failed { step: last_step.get(), message: e.to_string() },
        };
        emit(event);
    }
}

pub(super) fn probe_job(
    config: &TrainConfig,
    base: &LoadedModel,
    ranks: &[usize],
    token_budget: usize,
    control: &TrainControl,
    out: &Outbox,
    on_final: impl FnOnce(),
) {
    let result =
        crate::engine::bench::rank_probe(base, config, ranks, token_budget, control, &mut |r: &RankProbeResult| {
            if !out.send(Event::RankProbeResult(r.clone())) {
                control.request_stop();
            }
        });
    on_final();
    match result {
        Ok(results) => out.send(Event::RankProbeFinished { results }),
        Err(e) => out.send(Event::RankProbeFailed { message: e.to_string() }),
    };
}

/// Render a chat with the model's template, or with the plain fallback format training uses without one.
fn chat_prompt(model: &LoadedModel, messages: &[ChatMessage]) -> Result<Vec<u32>> {
    if model.chat_template.is_some() {
        return model.encode_chat(messages);
    }
    let spec = TokenizeSpec::for_model(model, usize::MAX / 2, false);
    let eos = spec.eos_token_id.and_then(|id| model.tokenizer.id_to_token(id)).unwrap_or_default();
    let text = data::tokenize::fallback_render(messages, true, &eos);
    model.tokenizer.encode(&text, true)
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
        let model = match (&job.adapter, job.side) {
            (Some(dir), ChatSide::Adapter) => {
                let mut m = base.model.clone();
                crate::engine::checkpoint::load_adapter(&mut m, dir)?;
                adapted = m;
                &adapted
            }
            _ => &base.model,
        };
        let prompt_ids = chat_prompt(base, &job.messages)?;
        out.send(Event::GenerationStarted { id, prompt_tokens: prompt_ids.len() });
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
            stop_reason: stop_reason_name(output.stop_reason).into(),
        })
    })();
    on_final();
    match result {
        Ok(stats) => out.send(Event::GenerationFinished { id, stats }),
        Err(e) => out.send(Event::GenerationFailed { id, message: e.to_string() }),
    };
}

fn stop_reason_name(r: StopReason) -> &'static str {
    match r {
        StopReason::Eos => "eos",
        StopReason::MaxTokens => "max_tokens",
        StopReason::StopString => "stop_string",
        StopReason::ContextFull => "context_full",
        StopReason::Cancelled => "cancelled",
    }
}
