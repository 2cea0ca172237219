//! The LoRA trainer: attaches adapters to a clone of the base model (sharing its weights), runs AdamW with
//! a schedule, accumulation and clipping over the dataset's batches, evaluates, checkpoints, and reports
//! everything as [`TrainEvent`]s. It never touches a UI: callers pass an `emit` callback.

pub mod advice;
pub mod backprop;
pub mod branch;
pub mod checkpoint_policy;
mod clock;
pub mod config;
pub mod config_file;
pub mod data_fit;
mod distributed_share;
pub mod early_stop;
mod evaluation;
pub mod events;
pub mod grpo;
mod layer_sums;
pub mod loss;
pub mod method;
pub mod optimizer;
mod plan;
pub mod preference;
mod recorder;
pub mod resume;
pub mod rows;
mod run_claim;
pub mod run_delete;
pub mod run_folder;
pub mod run_label;
pub mod run_lock;
pub mod run_table;
mod step_runner;
pub mod validate;

pub use config::{lr_at, Checkpointing, LoraSettings, ModelLimits, Schedule, Target, Targets, TrainConfig};
pub use distributed_share::require_data_parallel_method;
pub use events::{TrainControl, TrainEvent};
pub use loss::validation_loss;
pub use method::{Method, PreferenceLoss, PreferenceSettings};
pub use plan::plan_batches;
pub use rows::{prepare_data, TrainRows};
pub use step_runner::{BegunStep, QueuedUpdate, StepReport, StepRunner, WholeStep};

use crate::engine::checkpoint::{self, TrainerState};
use crate::engine::data::{self, BatchPlan, PreparedDataset};
use crate::engine::distributed::Group;
use crate::engine::lora::{self, AdapterParam};
use crate::engine::model::LoadedModel;
use crate::engine::{Error, Result};
use clock::{wait_while_paused, StepClock};
use early_stop::Verdict;
use recorder::Recorder;
pub use run_claim::default_run_name;
use run_claim::{claim_run_dir, run_dir_of};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Run a training job to completion (or stop/failure). Always emits exactly one `Finished` or `Failed`,
/// and returns the run folder. The run folder is claimed ([`run_lock::RunLock`]) for the whole run, and every event is
/// recorded in its metrics.jsonl before it is emitted; a failed write ends the run.
pub fn run_training(
    config: &TrainConfig,
    base: &LoadedModel,
    control: &TrainControl,
    emit: &mut dyn FnMut(TrainEvent),
) -> Result<PathBuf> {
    let mut recorder = Recorder::new(emit);
    let result = config.for_model(&base.config).and_then(|mut config| {
        // A checkpoint named relative to the working folder (`checkpoint-2` from inside its run) is made absolute,
        // so its run folder, its later siblings (a branch) and the paths run.json records are the real ones.
        if let Some(ckpt) = &config.resume {
            config.resume = Some(run_folder::absolute_path(ckpt)?);
        }
        // run.json records where the model and data are, to be found again from any folder (a resume from inside
        // the run folder, an export).
        for path in [&mut config.model, &mut config.data] {
            if path.is_relative() && path.exists() {
                *path = run_folder::absolute_path(path)?;
            }
        }
        Trainer::run(&config, base, control, &mut recorder)
    });
    if let Err(e) = &result {
        recorder.fail(e);
    }
    // The recorder, and with it the claim on the run folder, is dropped only after the final event.
    result
}

struct Trainer<'a> {
    config: &'a TrainConfig,
    runner: StepRunner,
    params: Vec<AdapterParam>,
    data: PreparedDataset,
    run_dir: PathBuf,
    adapter_config: checkpoint::PeftAdapterConfig,
    /// The base this run trains on, saved in every checkpoint (`base_model.json`).
    base_record: checkpoint::BaseRecord,
    pad_id: u32,
    /// Reported in the Started event (a changed dataset or a forced base on resume).
    notes: Vec<String>,
    /// A GRPO run's rewards, sampling and batch of completions.
    grpo: Option<grpo::run::GrpoRun>,
    /// The other ranks of a data-parallel run (None: this process trains alone).
    group: Option<Group>,
    /// Examples one per row, or packed (`--packing`).
    rows: TrainRows,
}

impl<'a> Trainer<'a> {
    fn run(config: &'a TrainConfig, base: &LoadedModel, control: &TrainControl, rec: &mut Recorder) -> Result<PathBuf> {
        config.validate_for_model(ModelLimits::of(&base.config))?;
        let started = Instant::now();
        // The dataset is read (and refused if it is not one) before its fingerprint reads it again.
        let data = prepare_data(config, base)?;
        data_fit::require_rows_fit(config.method, &data, &config.data)?;
        early_stop::require_validation(config, data.valid.as_ref().map_or(0, |v| v.examples.len()), &config.data)?;
        let fingerprints = resume::Fingerprints {
            base: crate::engine::model::fingerprint::model_fingerprint(base)?,
            dataset: data::dataset_fingerprint(&config.data)?,
        };
        // The ranks of a data-parallel run meet once each has its model and data (a rank that failed before is
        // named by the others' timeout, or stopped by the launcher).
        let group = distributed_share::join(config, base)?;
        let leader = distributed_share::leads(group.as_ref());
        // A clone shares the frozen weights with `base` (tensors are reference counted).
        let mut model = base.model.clone();
        lora::detach_adapters(&mut model);
        // Only the leader has a run folder; the others read the checkpoint they resume from and write nothing.
        let (run_dir, resume, branch) = match leader {
            true => run_dir_of(config)?,
            false => (PathBuf::new(), config.resume.clone(), None),
        };
        let mut forced_base = false;
        let params = match &resume {
            Some(ckpt) => {
                checkpoint::PeftAdapterConfig::read(ckpt)?.check_resume(&config.lora, model.config.num_layers, ckpt)?;
                forced_base = resume::check_base(config, ckpt, &fingerprints)?;
                let params = checkpoint::load_adapter_params(&mut model, ckpt)?.1;
                lora::set_dropout(&mut model, config.lora.dropout);
                params
            }
            None => lora::attach_new_adapters(&mut model, &config.lora, config.seed)?,
        };
        let adapter_config = checkpoint::PeftAdapterConfig::for_settings(
            &config.lora,
            model.config.num_layers,
            &config.base_model_name(),
        )?;
        let base_record = checkpoint::BaseRecord::new(&config.model, fingerprints.base.clone());
        let pad_id = base.eos_token_ids.first().copied().unwrap_or(0);
        let mut runner = StepRunner::new(model, &params, config.weight_decay, config.max_grad_norm, config.seed)?;
        runner.set_checkpointing(config.checkpointing)?;
        runner.rank = group.as_ref().map_or(0, |g| g.spec().rank);
        runner.preference = config
            .method
            .is_preference()
            .then(|| preference::PreferenceObjective::new(config.method, config.preference(), &base.model));
        let grpo = match config.method.is_reinforcement() {
            true => Some(grpo::run::GrpoRun::prepare(
                &config.grpo,
                base,
                &data.train,
                &train_locator(config, &data),
                pad_id,
            )?),
            false => None,
        };
        let mut notes: Vec<String> = base.notes.iter().chain(&data.summary.notes).cloned().collect();
        notes.extend(group.as_ref().map(Group::describe));
        let rows = TrainRows::new(config, &data.train.examples);
        notes.extend(rows.note(&data.train.examples, config.seq_len));
        let (plan, total_steps) = plan_batches(config, rows.lengths(&data.train.examples))?;
        let mut trainer = Trainer {
            config,
            runner,
            params,
            data,
            run_dir,
            adapter_config,
            base_record,
            pad_id,
            notes,
            grpo,
            group,
            rows,
        };
        trainer.notes.extend(config.warmup_note(total_steps));
        trainer.notes.extend(advice::run_warnings(config, &trainer.data.train, plan.num_examples(), total_steps));
        // Everything is checked before anything on disk changes, so a refused resume leaves the folder as it was.
        let start = trainer.initial_state(resume.as_deref(), &plan, total_steps)?;
        let resume_step = resume.as_ref().map(|_| start.0.step);
        if !leader {
            trainer.train(&plan, start, control, rec, started)?;
            trainer.group.take().map(Group::finish);
            return Ok(trainer.run_dir);
        }
        rec.attach(claim_run_dir(config, &trainer.run_dir, resume_step, branch.as_ref(), &fingerprints)?);
        if resume.is_some() {
            // run.json names the best checkpoint this folder holds (a branch's best so far lies in its parent).
            let best = checkpoint_policy::best_on_disk(&trainer.run_dir, start.0.best);
            run_folder::RunManifest::record_best(&trainer.run_dir, best)?;
        }
        if let Some(branch) = &branch {
            trainer.notes.push(branch::note(branch, &trainer.run_dir));
        }
        if let Some(ckpt) = &resume {
            let step = start.0.step;
            trainer.notes.extend(resume::record_resume(
                &trainer.run_dir,
                config,
                ckpt,
                step,
                &fingerprints,
                forced_base,
            )?);
        }
        trainer.train(&plan, start, control, rec, started)?;
        trainer.group.take().map(Group::finish);
        Ok(trainer.run_dir)
    }

    /// Train from `state` to the end of the plan (or a stop), evaluating and saving on the way. In a data-parallel
    /// run an error that a lost rank caused says so.
    fn train(
        &mut self,
        plan: &BatchPlan,
        start: (TrainerState, f64),
        control: &TrainControl,
        rec: &mut Recorder,
        started: Instant,
    ) -> Result<()> {
        let result = self.train_steps(plan, start, control, rec, started);
        match &self.group {
            Some(group) => result.map_err(|e| group.explain(e)),
            None => result,
        }
    }

    fn train_steps(
        &mut self,
        plan: &BatchPlan,
        (mut state, elapsed_before): (TrainerState, f64),
        control: &TrainControl,
        rec: &mut Recorder,
        started: Instant,
    ) -> Result<()> {
        let cfg = self.config;
        let total_steps = state.total_steps;
        rec.send(self.started_event(total_steps, state.step))?;
        let mut batches = plan.iter_from(state.cursor)?;
        let mut clock = StepClock::new(state.step, elapsed_before);
        let mut stopped_early = false;
        // A resumed run whose patience had already run out ends again at once, as it ended before.
        let mut early_stopped = state.step > 0 && early_stop::patience_ran_out(&state, cfg);
        // A resumed run starts from a checkpoint in this folder: it is saved already and is not rewritten
        // (resuming a finished run changes nothing on disk).
        let mut last_saved_step = (state.step > 0).then_some(state.step);
        // A step begun before the previous one was read (see `step_runner`): only its passes are queued, so
        // dropping it (a stop, an error) applies nothing of it.
        let mut ahead: Option<TrainerStep> = None;
        // A data-parallel run stops where the leader's stop request, summed with a step's gradients, reaches every
        // rank: they all leave after the same step.
        let mut stop_voted = false;
        while state.step < total_steps && !early_stopped {
            if stop_voted || (self.group.is_none() && control.stop_requested()) {
                stopped_early = true;
                break;
            }
            if control.is_paused() {
                let paused = wait_while_paused(control, state.step, rec)?;
                clock.exclude_pause(paused);
                continue;
            }
            let current = match ahead.take() {
                Some(begun) => begun,
                None => match self.begin_step(&mut batches, state.step, control) {
                    Ok(Some(begun)) => begun,
                    Ok(None) => break,
                    // A stop while GRPO samples ends the run as a stop between steps does.
                    Err(Error::Cancelled) if control.stop_requested() => {
                        stopped_early = true;
                        break;
                    }
                    Err(e) => return Err(e),
                },
            };
            let lr = lr_at(cfg, state.step, total_steps);
            let (begun, votes) = match self.group.as_mut() {
                Some(group) => {
                    let stop = [f32::from(u8::from(control.stop_requested()))];
                    let (begun, votes) = self.runner.share_across(group, current.begun, &stop)?;
                    (begun, Some(votes))
                }
                None => (current.begun, None),
            };
            let queued = self.runner.queue_update(begun, lr)?;
            // The next step is begun before this one is read, unless something must see this step's weights
            // (an evaluation, a checkpoint) or the run ends or waits after it.
            let this_step = state.step + 1;
            // GRPO samples with the weights of the step before: nothing is begun ahead.
            // In a data-parallel run the ranks sum a step's gradients while they begin it, so all of them must
            // begin the same steps: a stop or pause request, which reaches each rank at its own moment (or only
            // the leader), does not decide it there (the leader's stop is voted on with the step's sums).
            let asked_to_wait = self.group.is_none() && (control.stop_requested() || control.is_paused());
            let look_ahead = this_step < total_steps
                && self.grpo.is_none()
                && !self.eval_due(this_step, total_steps)
                && !self.save_due(this_step, total_steps)
                && !asked_to_wait;
            let next_step = if look_ahead { self.begin_step(&mut batches, this_step, control) } else { Ok(None) };
            let report = self.runner.finish_report(queued)?;
            if let Some(votes) = votes {
                stop_voted = votes.flatten_all()?.to_vec1::<f32>()?.first().is_some_and(|&v| v > 0.0);
            }
            let training_secs = current.began.elapsed().as_secs_f64();
            let grpo = report.grpo.and_then(|m| self.grpo.as_ref()?.metrics(state.step, &m, training_secs));
            let progress = StepProgress { report, lr, cursor: current.cursor, tokens: current.tokens };
            let mut event = self.record_step(progress, &mut state, total_steps, &mut clock, last_saved_step)?;
            if let TrainEvent::Step { grpo: slot, .. } = &mut event {
                *slot = grpo.map(Box::new);
            }
            rec.send(event)?;
            if let Some(samples) = self.samples_due(state.step) {
                rec.send(TrainEvent::Samples { step: state.step, samples })?;
            }
            // A failure to begin the next step is reported after this step's event.
            ahead = next_step?;
            let verdict = match self.eval_due(state.step, total_steps) {
                true => self.evaluate(&mut state, rec)?,
                false => Verdict { new_best: false, stop: false },
            };
            // A new best is saved at once, so the best checkpoint always exists on disk.
            if self.save_due(state.step, total_steps) || verdict.new_best {
                state.elapsed_secs = clock.elapsed_secs();
                self.save(&mut state, rec)?;
                last_saved_step = Some(state.step);
            }
            early_stopped = verdict.stop;
        }
        if state.step > 0 && !stopped_early && !early_stopped {
            self.evaluate(&mut state, rec)?;
        }
        state.elapsed_secs = clock.elapsed_secs();
        if state.step > 0 && last_saved_step != Some(state.step) {
            self.save(&mut state, rec)?;
        }
        rec.send(TrainEvent::Finished {
            step: state.step,
            final_loss: state.train_loss,
            final_val_loss: state.val_loss,
            stopped_early,
            elapsed_secs: started.elapsed().as_secs_f64() + elapsed_before - clock.paused_secs,
            early_stop: early_stopped.then(|| early_stop::early_stop(&state, cfg)),
        })
    }

    /// A fresh run's state, or the checkpoint's (optimizer moments restored, its data position checked
    /// against `plan`); and the training time already spent before this process. Reads only.
    fn initial_state(
        &mut self,
        resume: Option<&Path>,
        plan: &BatchPlan,
        total_steps: usize,
    ) -> Result<(TrainerState, f64)> {
        let Some(ckpt) = resume else {
            let state = TrainerState::fresh(total_steps, plan.start(), self.config.seed);
            return Ok((state, 0.0));
        };
        let (saved, moments) = checkpoint::load_trainer_state(ckpt)?;
        plan.iter_from(saved.cursor)?;
        if let Some(grpo) = self.grpo.as_mut() {
            grpo.restore(ckpt, saved.step)?;
        }
        self.runner.optimizer.load_state(&moments, saved.step)?;
        let elapsed_before = saved.elapsed_secs;
        Ok((TrainerState { total_steps, ..saved }, elapsed_before))
    }

    fn started_event(&self, total_steps: usize, start_step: usize) -> TrainEvent {
        let summary = &self.data.summary;
        TrainEvent::Started {
            run_dir: self.run_dir.clone(),
            config: Box::new(self.config.clone()),
            trainable_params: self.params.iter().map(|p| p.elem_count()).sum(),
            total_steps,
            tokens_per_epoch: summary.tokens_per_epoch,
            target_tokens_per_epoch: summary.target_tokens_per_epoch,
            train_examples: self.data.train.examples.len(),
            valid_examples: self.data.valid.as_ref().map(|v| v.examples.len()).unwrap_or(0),
            truncated_examples: summary.truncated,
            start_step,
            notes: self.notes.clone(),
        }
    }

    /// Collate the next optimizer step's micro-batches and begin it (None when the plan is done). `step` is the
    /// count of steps done before it.
    fn begin_step(
        &mut self,
        batches: &mut data::BatchIter<'_>,
        step: usize,
        control: &TrainControl,
    ) -> Result<Option<TrainerStep>> {
        if self.grpo.is_some() {
            return self.begin_grpo_step(batches, step, control);
        }
        let began = Instant::now();
        let micro: Vec<_> = (0..self.config.grad_accum).filter_map(|_| batches.next()).collect();
        let Some(last) = micro.last() else { return Ok(None) };
        let train = &self.data.train;
        let collated = micro
            .iter()
            .map(|b| match self.runner.preference.is_some() {
                true => data::collate_pairs(train, &b.indices, self.pad_id),
                false => self.rows.collate(&train.examples, &b.indices, self.pad_id),
            })
            .collect::<Result<Vec<_>>>()?;
        let tokens = StepTokens {
            trained: collated.iter().map(|b| b.lengths.iter().sum::<usize>()).sum(),
            padded: collated.iter().map(|b| b.batch_size * b.seq_len).sum(),
        };
        let begun = match self.group.as_mut() {
            None => self.runner.begin(&collated)?,
            Some(group) => {
                let indices: Vec<Vec<usize>> = micro.iter().map(|b| b.indices.clone()).collect();
                let (mine, whole) = distributed_share::shard_step(
                    group,
                    (&self.rows, &train.examples),
                    &indices,
                    &collated,
                    self.pad_id,
                )?;
                self.runner.begin_share(&mine, Some(whole), Some(group))?
            }
        };
        Ok(Some(TrainerStep { begun, cursor: last.next, tokens, began }))
    }

    /// A GRPO step: on a round's first step, sample and score completions of the next prompts (the data position
    /// moves on then); every step trains on the round's completions.
    fn begin_grpo_step(
        &mut self,
        batches: &mut data::BatchIter<'_>,
        step: usize,
        control: &TrainControl,
    ) -> Result<Option<TrainerStep>> {
        let Some(grpo) = self.grpo.as_mut() else { return Ok(None) };
        let mut cursor = batches.cursor();
        if grpo.starts_round(step) {
            let micro: Vec<_> = (0..self.config.grad_accum).filter_map(|_| batches.next()).collect();
            let Some(last) = micro.last() else { return Ok(None) };
            cursor = last.next;
            let prompts: Vec<Vec<usize>> = micro.iter().map(|b| b.indices.clone()).collect();
            let locate = train_locator(self.config, &self.data);
            let cancelled = || control.stop_requested();
            let source = (&self.data.train, &locate as &dyn Fn(usize) -> String);
            grpo.new_round(&self.runner.model, source, &prompts, (self.config.seed, step), &cancelled)?;
        }
        let began = Instant::now();
        let Some((_, rollout)) = grpo.rollout.as_ref() else { return Ok(None) };
        let lengths = rollout.completions.iter().map(|c| c.prompt_ids.len() + c.ids.len());
        let tokens = StepTokens { trained: lengths.clone().sum(), padded: lengths.sum() };
        let begun = self.runner.begin_grpo(&grpo.objective, rollout)?;
        Ok(Some(TrainerStep { begun, cursor, tokens, began }))
    }

    /// A few of the GRPO batch's completions after step `step`, every `sample_every` steps and after the first.
    fn samples_due(&self, step: usize) -> Option<Vec<grpo::GrpoSample>> {
        let grpo = self.grpo.as_ref()?;
        let every = self.config.grpo.sample_every;
        if every == 0 || !(step == 1 || step.is_multiple_of(every)) {
            return None;
        }
        Some(grpo.samples(&self.data.train, &train_locator(self.config, &self.data))).filter(|s| !s.is_empty())
    }

    /// Whether an evaluation runs after `step` (not after the last: the run's end evaluates).
    fn eval_due(&self, step: usize, total_steps: usize) -> bool {
        self.config.val_every > 0 && step.is_multiple_of(self.config.val_every) && step < total_steps
    }

    /// Whether a checkpoint is saved after `step` (not after the last: the run's end saves).
    fn save_due(&self, step: usize, total_steps: usize) -> bool {
        self.config.save_every > 0 && step.is_multiple_of(self.config.save_every) && step < total_steps
    }

    /// Count a finished step into `state` and return its Step event, or an error when the loss stopped being
    /// finite (nothing from that step was applied or saved).
    fn record_step(
        &mut self,
        progress: StepProgress,
        state: &mut TrainerState,
        total_steps: usize,
        clock: &mut StepClock,
        last_saved_step: Option<usize>,
    ) -> Result<TrainEvent> {
        let StepProgress { report, lr, cursor, tokens } = progress;
        let StepReport { loss, grad_norm, preference, .. } = report;
        if !loss.is_finite() {
            return Err(Error::Training(format!(
                "the loss became {loss} at step {}; nothing was saved from this step (last checkpoint: {}). \
                 Lower the learning rate or check the data",
                state.step + 1,
                last_saved_step.map(|s| format!("step {s}")).unwrap_or("none".into())
            )));
        }
        state.step += 1;
        state.cursor = cursor;
        state.train_loss = Some(loss);
        state.trained_tokens += tokens.trained;
        let (tokens_per_sec, elapsed_secs, eta_secs) = clock.record(tokens.padded, state.step, total_steps);
        Ok(TrainEvent::Step {
            step: state.step,
            total_steps,
            loss,
            lr,
            grad_norm,
            tokens_per_sec,
            trained_tokens: state.trained_tokens,
            elapsed_secs,
            eta_secs,
            grpo: None,
            preference,
        })
    }

    /// Save a checkpoint into the run folder, which must still be the one this run claimed; record it in run.json
    /// when it is the best, then keep `save_total_limit`.
    fn save(&self, state: &mut TrainerState, rec: &mut Recorder) -> Result<()> {
        // The other ranks of a data-parallel run hold the same adapters: only the leader writes.
        if !distributed_share::leads(self.group.as_ref()) {
            return Ok(());
        }
        state.saved_unix_secs = checkpoint::unix_now();
        rec.check_folder()?;
        let extra = match &self.grpo {
            Some(grpo) => grpo.checkpoint_files(state.step)?,
            None => Vec::new(),
        };
        let path = checkpoint::save_checkpoint(
            &self.run_dir,
            &self.params,
            &self.adapter_config,
            &self.base_record,
            &self.runner.optimizer.state_tensors()?,
            state,
            &extra,
        )?;
        rec.send(TrainEvent::CheckpointSaved { step: state.step, path })?;
        if let Some(best) = state.best.filter(|b| b.step == state.step) {
            rec.check_folder()?;
            run_folder::RunManifest::record_best(&self.run_dir, Some(best))?;
        }
        rec.check_folder()?;
        let best_step = state.best.map(|b| b.step);
        let paths = checkpoint_policy::prune(&self.run_dir, self.config.save_total_limit, best_step)?;
        if paths.is_empty() {
            return Ok(());
        }
        rec.send(TrainEvent::CheckpointsRemoved { step: state.step, paths })
    }
}

/// An optimizer step of the trainer, begun: its passes queued, and what it will count once it is read.
struct TrainerStep {
    begun: BegunStep,
    /// The data position after its batches (what a checkpoint after it stores).
    cursor: data::DataCursor,
    tokens: StepTokens,
    /// When its passes began (GRPO reports its training time apart from sampling).
    began: Instant,
}

/// Where prompt `i` of the training split of `config`'s dataset is, for messages.
fn train_locator<'d>(config: &'d TrainConfig, data: &'d PreparedDataset) -> impl Fn(usize) -> String + 'd {
    move |i| match data.train.source_lines.get(i) {
        Some(line) => format!("{}: training row at line {line}", config.data.display()),
        None => format!("{}: training prompt {}", config.data.display(), i + 1),
    }
}

/// Tokens of a step's micro-batches: real ones (trained) and with padding (throughput).
struct StepTokens {
    trained: usize,
    padded: usize,
}

/// A step as read back, for [`Trainer::record_step`].
struct StepProgress {
    report: StepReport,
    lr: f64,
    cursor: data::DataCursor,
    tokens: StepTokens,
}
