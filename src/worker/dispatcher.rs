//! The dispatcher thread: owns the shared base model and the controls of running jobs, turns each command
//! into a job on its own thread, and keeps track of which jobs are running.

use super::data_parallel_job::data_parallel_job;
use super::*;

pub(super) struct Dispatcher {
    /// For job threads to report back to the dispatcher.
    pub(super) inbox: Sender<Msg>,
    pub(super) out: Outbox,
    pub(super) model: Option<(PathBuf, Arc<LoadedModel>)>,
    pub(super) training: Option<TrainControl>,
    pub(super) probe: ProbeSlot,
    pub(super) generations: HashMap<u64, Arc<AtomicBool>>,
    /// The cancel flag of the running Hub download.
    pub(super) download: Option<Arc<AtomicBool>>,
    /// The cancel flag of the running evaluation.
    pub(super) evaluation: Option<Arc<AtomicBool>>,
    /// The rows of the dataset last paged ([`Command::BrowseRows`]), shared by the page jobs (one reads the
    /// files, the others wait for it).
    pub(super) rows: Arc<std::sync::Mutex<Option<Arc<crate::engine::data::RowBrowser>>>>,
}

impl Dispatcher {
    pub(super) fn run(mut self, inbox: Receiver<Msg>) {
        while let Ok(msg) = inbox.recv() {
            match msg {
                Msg::Command(c) => self.command(c),
                Msg::ModelReady { path, model } => self.model = Some((path, model)),
                Msg::TrainingEnded => self.training = None,
                Msg::ProbeEnded => {
                    if let Some((config, job)) = self.probe.ended() {
                        self.start_probe(config, job);
                    }
                }
                Msg::GenerationEnded { id } => {
                    self.generations.remove(&id);
                }
                Msg::DownloadEnded => self.download = None,
                Msg::EvaluationEnded => self.evaluation = None,
                Msg::Shutdown => break,
            }
        }
        self.stop_all();
    }

    fn stop_all(&mut self) {
        if let Some(c) = &self.training {
            c.request_stop();
        }
        self.probe.queued = None;
        if let Some(c) = &self.probe.control {
            c.request_stop();
        }
        for flag in self.generations.values() {
            flag.store(true, Ordering::SeqCst);
        }
        self.cancel_download();
        self.cancel_evaluation();
    }

    fn base_for(&self, path: &std::path::Path) -> Option<Arc<LoadedModel>> {
        let (loaded, model) = self.model.as_ref()?;
        same_path(loaded, path).then(|| model.clone())
    }

    fn command(&mut self, command: Command) {
        match command {
            Command::LoadModel { path, device, dtype, quantize } => self.load_model(path, (device, dtype, quantize)),
            Command::InspectDataset { path, read, max_seq_len, train_on_prompt, preview_rows } => {
                self.inspect_dataset(path, read, max_seq_len, train_on_prompt, preview_rows)
            }
            Command::BrowseRows(request) => self.browse_rows(*request),
            Command::CheckAdapter { path } => self.check_adapter(path),
            Command::ScanModels { hf_cache, extra_dirs } => self.scan_models(hf_cache, extra_dirs),
            Command::StartTraining(config) => self.start_training(*config, None),
            Command::StartTrainingOnGpus { config, gpus, program } => {
                self.start_training(*config, Some((gpus, program)))
            }
            Command::PauseTraining(paused) => {
                if let Some(c) = &self.training {
                    c.set_paused(paused);
                }
            }
            Command::StopTraining => {
                if let Some(c) = &self.training {
                    c.set_paused(false);
                    c.request_stop();
                }
            }
            Command::Generate(job) => self.start_generation(job),
            Command::CancelGeneration { id } => {
                if let Some(flag) = self.generations.get(&id) {
                    flag.store(true, Ordering::SeqCst);
                }
            }
            Command::Diagnose => self.diagnose(),
            Command::XrayCheckpoint { checkpoint } => self.xray(checkpoint),
            Command::ListRuns { runs_dir } => self.list_runs(runs_dir),
            Command::DeleteCheckpoint { path } => self.delete_checkpoint(path),
            Command::RenameRun { run_dir, label } => self.rename_run(run_dir, label),
            Command::SetRunNotes { run_dir, notes } => self.set_run_notes(run_dir, notes),
            Command::PlanRunDelete { runs_dir, run_dir } => self.plan_run_delete(runs_dir, run_dir),
            Command::DeleteRun { runs_dir, run_dir } => self.delete_run(runs_dir, run_dir),
            Command::ExportCheckpoint { checkpoint, format, quant, out, base_model, overwrite } => {
                let what = format!("export {}", checkpoint.display());
                let request = crate::engine::export::ExportRequest {
                    checkpoint: Some(checkpoint),
                    format,
                    quant,
                    out,
                    base_model,
                    allow_other_base: false,
                    overwrite,
                };
                self.spawn_fallible(
                    "mc-export",
                    move |error| Event::ActionFailed { what: what.clone(), error },
                    move |events| {
                        let progress = &mut |p: crate::engine::export::ExportProgress| {
                            events.send(Event::ExportProgress { done: p.done, total: p.total, what: p.what });
                        };
                        if let Ok(warnings) = crate::engine::export::export_stop_warnings(&request) {
                            if !warnings.is_empty() {
                                let warnings = warnings.iter().map(ToString::to_string).collect();
                                events.send(Event::ExportWarnings { warnings });
                            }
                        }
                        let done = crate::engine::export::export_with(&request, progress)?;
                        Ok(Event::ExportFinished { path: done.path, size_bytes: done.size_bytes })
                    },
                );
            }
            Command::RankProbe { config, ranks, token_budget } => {
                self.start_probe(*config, jobs::ProbeJob::Sweep { ranks, token_budget })
            }
            Command::CalibrateRankProbe { config, rank } => {
                self.start_probe(*config, jobs::ProbeJob::Calibrate { rank })
            }
            Command::StopRankProbe => {
                self.probe.queued = None;
                if let Some(c) = &self.probe.control {
                    c.request_stop();
                }
            }
            Command::LoraMicroBench { repeats } => self.micro_bench(repeats),
            Command::HubSearch { settings, kind, query } => self.hub_search(settings, kind, query),
            Command::HubDownload { settings, kind, spec } => self.hub_download(settings, kind, spec),
            Command::CancelHubDownload => self.cancel_download(),
            Command::Evaluate(spec) => self.start_evaluation(*spec),
            Command::CancelEvaluation => self.cancel_evaluation(),
        }
    }

    fn load_model(&self, path: PathBuf, placement: (DeviceChoice, DTypeChoice, BaseQuant)) {
        let out = self.out.clone();
        let inbox = self.inbox.clone();
        out.send(Event::ModelLoading { path: path.clone() });
        let fail_path = path.clone();
        spawn_job(
            "mc-load",
            self.out.clone(),
            move |error| Event::ModelLoadFailed { path: fail_path, error },
            move || jobs::load_model_job(&path, placement, &out, &inbox),
        );
    }

    fn inspect_dataset(
        &self,
        path: PathBuf,
        read: crate::engine::data::ReadOptions,
        max_seq_len: usize,
        train_on_prompt: bool,
        preview_rows: usize,
    ) {
        let model = self.model.as_ref().map(|(_, m)| m.clone());
        let fail_path = path.clone();
        self.spawn_fallible(
            "mc-dataset",
            move |error| Event::DatasetFailed { path: fail_path.clone(), error },
            move |_| {
                let report = crate::engine::data::inspect_dataset_with(
                    &path,
                    &read,
                    model.as_deref(),
                    max_seq_len,
                    train_on_prompt,
                    preview_rows,
                )?;
                Ok(Event::DatasetInspected(Box::new(report)))
            },
        );
    }

    fn scan_models(&self, hf_cache: Option<PathBuf>, extra_dirs: Vec<PathBuf>) {
        let out = self.out.clone();
        spawn_job(
            "mc-scan",
            self.out.clone(),
            |_| Event::ModelsFound(Vec::new()),
            move || {
                let found = scan_models(hf_cache.as_deref(), &extra_dirs);
                out.send(Event::ModelsFound(found));
            },
        );
    }

    fn diagnose(&self) {
        let out = self.out.clone();
        spawn_job(
            "mc-doctor",
            self.out.clone(),
            |error| Event::Diagnosis { text: format!("the report failed: {}", error.message) },
            move || {
                out.send(Event::Diagnosis { text: crate::engine::doctor::report().to_string() });
            },
        );
    }

    fn list_runs(&self, runs_dir: PathBuf) {
        let dir = runs_dir.clone();
        self.spawn_fallible(
            "mc-runs",
            move |error| Event::RunsFailed { runs_dir: dir.clone(), error },
            move |_| {
                let runs = crate::engine::train::run_folder::list_runs(&runs_dir)?;
                Ok(Event::Runs { runs_dir, runs })
            },
        );
    }

    fn delete_checkpoint(&self, path: PathBuf) {
        let what = format!("delete {}", path.display());
        self.spawn_fallible(
            "mc-delete",
            move |error| Event::ActionFailed { what: what.clone(), error },
            move |_| {
                crate::engine::checkpoint::delete_checkpoint(&path)?;
                Ok(Event::CheckpointDeleted { path })
            },
        );
    }

    fn rename_run(&self, run_dir: PathBuf, label: String) {
        let what = format!("rename {}", run_dir.display());
        self.spawn_fallible(
            "mc-rename",
            move |error| Event::ActionFailed { what: what.clone(), error },
            move |_| {
                let label = crate::engine::train::run_label::rename_run(&run_dir, &label)?;
                Ok(Event::RunRenamed { run_dir, label })
            },
        );
    }

    fn micro_bench(&self, repeats: usize) {
        let device = self.model.as_ref().map(|(_, m)| m.model.device().clone());
        self.spawn_fallible(
            "mc-microbench",
            |error| Event::MicroBenchFailed { error },
            move |_| {
                let device = device.unwrap_or(candle_core::Device::Cpu);
                Ok(Event::MicroBenchFinished(crate::engine::bench::bench_lora_micro(&device, repeats)?))
            },
        );
    }

    /// Run `body` on its own thread and send the event it returns; an error (or a panic) becomes the event
    /// `on_error` makes of it. `body` may send progress events of its own through the outbox it is given.
    pub(super) fn spawn_fallible<F>(
        &self,
        name: &str,
        on_error: F,
        body: impl FnOnce(&Outbox) -> crate::engine::Result<Event> + Send + 'static,
    ) where
        F: Fn(ErrorInfo) -> Event + Clone + Send + 'static,
    {
        let (out, on_failure) = (self.out.clone(), on_error.clone());
        spawn_job(name, self.out.clone(), on_error, move || {
            let event = body(&out).unwrap_or_else(|e| on_failure(e.into()));
            out.send(event);
        });
    }

    /// Train in this process, or with `on_gpus` (count, this binary) as a data-parallel run of that many processes.
    fn start_training(&mut self, config: TrainConfig, on_gpus: Option<(usize, std::path::PathBuf)>) {
        // Refusals before a job starts are about settings, not training.
        let fail = |out: &Outbox, message: String| {
            out.send(Event::Train(TrainEvent::Failed { step: 0, message, kind: ErrorKind::Setting }));
        };
        if self.training.is_some() {
            return fail(&self.out, "a training run is already in progress; stop it first".into());
        }
        let Some(base) = self.base_for(&config.model) else {
            return fail(
                &self.out,
                format!("load the model {} before training (the model panel's Load button)", config.model.display()),
            );
        };
        let control = TrainControl::default();
        self.training = Some(control.clone());
        let out = self.out.clone();
        let inbox = self.inbox.clone();
        let guard_inbox = self.inbox.clone();
        spawn_job(
            "mc-train",
            self.out.clone(),
            move |error| {
                let _ = guard_inbox.send(Msg::TrainingEnded);
                Event::Train(TrainEvent::Failed { step: 0, message: error.message, kind: error.kind })
            },
            move || {
                let on_final = || {
                    let _ = inbox.send(Msg::TrainingEnded);
                };
                match on_gpus {
                    None => jobs::train_job(&config, &base, &control, &out, on_final),
                    Some((gpus, program)) => {
                        data_parallel_job(&config, &base, (gpus, &program), &control, &out, on_final)
                    }
                }
            },
        );
    }

    /// A rank sweep or its speed measurement: one at a time, stopped by `StopRankProbe`.
    fn start_probe(&mut self, config: TrainConfig, job: jobs::ProbeJob) {
        if let Some(running) = &self.probe.control {
            if self.probe.calibrating && matches!(job, jobs::ProbeJob::Sweep { .. }) {
                // The sweep outranks the speed measurement for its estimate: stop that, then start this.
                running.request_stop();
                self.probe.queued = Some((config, job));
            } else {
                self.out.send(job.failed(ErrorInfo::new(ErrorKind::Setting, "a rank probe is already running")));
            }
            return;
        }
        let Some(base) = self.base_for(&config.model) else {
            self.out.send(job.failed(ErrorInfo::new(
                ErrorKind::Setting,
                format!("load the model {} before probing ranks", config.model.display()),
            )));
            return;
        };
        let control = TrainControl::default();
        self.probe.control = Some(control.clone());
        self.probe.calibrating = matches!(job, jobs::ProbeJob::Calibrate { .. });
        let out = self.out.clone();
        let inbox = self.inbox.clone();
        let guard_inbox = self.inbox.clone();
        let on_panic = job.clone();
        spawn_job(
            "mc-probe",
            self.out.clone(),
            move |error| {
                let _ = guard_inbox.send(Msg::ProbeEnded);
                on_panic.failed(error)
            },
            move || {
                jobs::probe_job(&config, &base, &job, &control, &out, || {
                    let _ = inbox.send(Msg::ProbeEnded);
                });
            },
        );
    }

    fn start_generation(&mut self, job: GenerateJob) {
        let id = job.id;
        let Some((_, base)) = self.model.as_ref() else {
            let error = ErrorInfo::new(ErrorKind::Setting, "load a model first (Model panel)");
            self.out.send(Event::GenerationFailed { id, error });
            return;
        };
        let base = base.clone();
        let cancel = Arc::new(AtomicBool::new(false));
        self.generations.insert(id, cancel.clone());
        let out = self.out.clone();
        let inbox = self.inbox.clone();
        let guard_inbox = self.inbox.clone();
        spawn_job(
            "mc-generate",
            self.out.clone(),
            move |error| {
                let _ = guard_inbox.send(Msg::GenerationEnded { id });
                Event::GenerationFailed { id, error }
            },
            move || {
                jobs::generate_job(&job, &base, &cancel, &out, || {
                    let _ = inbox.send(Msg::GenerationEnded { id });
                });
            },
        );
    }
}

/// The rank probe job in flight (a sweep or its speed measurement; one at a time), and a sweep asked for while
/// a measurement ran, started when that ends.
#[derive(Default)]
pub(super) struct ProbeSlot {
    control: Option<TrainControl>,
    calibrating: bool,
    queued: Option<(TrainConfig, jobs::ProbeJob)>,
}

impl ProbeSlot {
    /// The job ended: the slot is free; returns the sweep waiting for it.
    fn ended(&mut self) -> Option<(TrainConfig, jobs::ProbeJob)> {
        self.control = None;
        self.calibrating = false;
        self.queued.take()
    }
}

/// Run `body` on a named thread. A panic inside it becomes the event `on_panic` makes (an internal error), so
/// the front end always hears how a job ended; a thread that cannot be started is reported the same way.
pub(super) fn spawn_job(
    name: &str,
    out: Outbox,
    on_panic: impl FnOnce(ErrorInfo) -> Event + Send + 'static,
    body: impl FnOnce() + Send + 'static,
) {
    let (panic_out, panic_msg) = (out.clone(), Arc::new(std::sync::Mutex::new(Some(on_panic))));
    let for_thread = panic_msg.clone();
    let spawned = std::thread::Builder::new().name(name.into()).spawn(move || {
        if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
            let text = panic_text(payload.as_ref());
            if let Some(make) = for_thread.lock().ok().and_then(|mut g| g.take()) {
                panic_out.send(make(ErrorInfo::new(ErrorKind::Internal, format!("internal error (panic): {text}"))));
            }
        }
    });
    if let Err(e) = spawned {
        if let Some(make) = panic_msg.lock().ok().and_then(|mut g| g.take()) {
            out.send(make(ErrorInfo::new(ErrorKind::Internal, format!("cannot start a thread: {e}"))));
        }
    }
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".into()
    }
}
