//! The dispatcher thread: owns the shared base model and the controls of running jobs, turns each command
//! into a job on its own thread, and keeps track of which jobs are running.

use super::*;

pub(super) struct Dispatcher {
    /// For job threads to report back to the dispatcher.
    pub(super) inbox: Sender<Msg>,
    pub(super) out: Outbox,
    pub(super) model: Option<(PathBuf, Arc<LoadedModel>)>,
    pub(super) training: Option<TrainControl>,
    pub(super) probe: Option<TrainControl>,
    pub(super) generations: HashMap<u64, Arc<AtomicBool>>,
}

impl Dispatcher {
    pub(super) fn run(mut self, inbox: Receiver<Msg>) {
        while let Ok(msg) = inbox.recv() {
            match msg {
                Msg::Command(c) => self.command(c),
                Msg::ModelReady { path, model } => self.model = Some((path, model)),
                Msg::TrainingEnded => self.training = None,
                Msg::ProbeEnded => self.probe = None,
                Msg::GenerationEnded { id } => {
                    self.generations.remove(&id);
                }
                Msg::Shutdown => break,
            }
        }
        self.stop_all();
    }

    fn stop_all(&mut self) {
        if let Some(c) = &self.training {
            c.request_stop();
        }
        if let Some(c) = &self.probe {
            c.request_stop();
        }
        for flag in self.generations.values() {
            flag.store(true, Ordering::SeqCst);
        }
    }

    fn base_for(&self, path: &std::path::Path) -> Option<Arc<LoadedModel>> {
        let (loaded, model) = self.model.as_ref()?;
        same_path(loaded, path).then(|| model.clone())
    }

    fn command(&mut self, command: Command) {
        match command {
            Command::LoadModel { path, device, dtype } => {
                let out = self.out.clone();
                let inbox = self.inbox.clone();
                out.send(Event::ModelLoading { path: path.clone() });
                let fail_path = path.clone();
                spawn_job(
                    "mc-load",
                    self.out.clone(),
                    move |error| Event::ModelLoadFailed { path: fail_path, error },
                    move || jobs::load_model_job(&path, device, dtype, &out, &inbox),
                );
            }
            Command::InspectDataset { path, max_seq_len, train_on_prompt, preview_rows } => {
                let model = self.model.as_ref().map(|(_, m)| m.clone());
                let out = self.out.clone();
                let fail_path = path.clone();
                spawn_job(
                    "mc-dataset",
                    self.out.clone(),
                    move |error| Event::DatasetFailed { path: fail_path, error },
                    move || {
                        let report = crate::engine::data::inspect_dataset(
                            &path,
                            model.as_deref(),
                            max_seq_len,
                            train_on_prompt,
                            preview_rows,
                        );
                        match report {
                            Ok(r) => out.send(Event::DatasetInspected(Box::new(r))),
                            Err(e) => out.send(Event::DatasetFailed { path, error: e.into() }),
                        };
                    },
                );
            }
            Command::ScanModels { hf_cache, extra_dirs } => {
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
            Command::StartTraining(config) => self.start_training(*config),
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
            Command::Diagnose => {
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
            Command::ListRuns { runs_dir } => {
                let out = self.out.clone();
                let dir = runs_dir.clone();
                spawn_job(
                    "mc-runs",
                    self.out.clone(),
                    move |error| Event::RunsFailed { runs_dir: dir, error },
                    move || {
                        match crate::engine::train::run_folder::list_runs(&runs_dir) {
                            Ok(runs) => out.send(Event::Runs { runs_dir, runs }),
                            Err(e) => out.send(Event::RunsFailed { runs_dir, error: e.into() }),
                        };
                    },
                );
            }
            Command::DeleteCheckpoint { path } => {
                let out = self.out.clone();
                let what = format!("delete {}", path.display());
                spawn_job(
                    "mc-delete",
                    self.out.clone(),
                    move |error| Event::ActionFailed { what, error },
                    move || {
                        match crate::engine::checkpoint::delete_checkpoint(&path) {
                            Ok(()) => out.send(Event::CheckpointDeleted { path }),
                            Err(e) => out.send(Event::ActionFailed {
                                what: format!("delete {}", path.display()),
                                error: e.into(),
                            }),
                        };
                    },
                );
            }
            Command::ExportCheckpoint { checkpoint, format, quant, out: out_dir, base_model } => {
                let out = self.out.clone();
                let what = format!("export {}", checkpoint.display());
                let what2 = what.clone();
                spawn_job(
                    "mc-export",
                    self.out.clone(),
                    move |error| Event::ActionFailed { what, error },
                    move || {
                        let request = crate::engine::export::ExportRequest {
                            checkpoint: Some(checkpoint),
                            format,
                            quant,
                            out: out_dir,
                            base_model,
                        };
                        let progress = &mut |p: crate::engine::export::ExportProgress| {
                            out.send(Event::ExportProgress { done: p.done, total: p.total, what: p.what });
                        };
                        if let Ok(warnings) = crate::engine::export::export_stop_warnings(&request) {
                            if !warnings.is_empty() {
                                let warnings = warnings.iter().map(ToString::to_string).collect();
                                out.send(Event::ExportWarnings { warnings });
                            }
                        }
                        match crate::engine::export::export_with(&request, progress) {
                            Ok(done) => {
                                out.send(Event::ExportFinished { path: done.path, size_bytes: done.size_bytes })
                            }
                            Err(e) => out.send(Event::ActionFailed { what: what2, error: e.into() }),
                        };
                    },
                );
            }
            Command::RankProbe { config, ranks, token_budget } => self.start_probe(*config, ranks, token_budget),
            Command::StopRankProbe => {
                if let Some(c) = &self.probe {
                    c.request_stop();
                }
            }
            Command::LoraMicroBench { repeats } => {
                let device = self.model.as_ref().map(|(_, m)| m.model.device().clone());
                let out = self.out.clone();
                spawn_job(
                    "mc-microbench",
                    self.out.clone(),
                    |error| Event::MicroBenchFailed { error },
                    move || {
                        let device = device.unwrap_or(candle_core::Device::Cpu);
                        match crate::engine::bench::bench_lora_micro(&device, repeats) {
                            Ok(r) => out.send(Event::MicroBenchFinished(r)),
                            Err(e) => out.send(Event::MicroBenchFailed { error: e.into() }),
                        };
                    },
                );
            }
        }
    }

    fn start_training(&mut self, config: TrainConfig) {
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
                jobs::train_job(&config, &base, &control, &out, || {
                    let _ = inbox.send(Msg::TrainingEnded);
                });
            },
        );
    }

    fn start_probe(&mut self, config: TrainConfig, ranks: Vec<usize>, token_budget: usize) {
        if self.probe.is_some() {
            self.out.send(Event::RankProbeFailed {
                error: ErrorInfo::new(ErrorKind::Setting, "a rank probe is already running"),
            });
            return;
        }
        let Some(base) = self.base_for(&config.model) else {
            self.out.send(Event::RankProbeFailed {
                error: ErrorInfo::new(
                    ErrorKind::Setting,
                    format!("load the model {} before probing ranks", config.model.display()),
                ),
            });
            return;
        };
        let control = TrainControl::default();
        self.probe = Some(control.clone());
        let out = self.out.clone();
        let inbox = self.inbox.clone();
        let guard_inbox = self.inbox.clone();
        spawn_job(
            "mc-probe",
            self.out.clone(),
            move |error| {
                let _ = guard_inbox.send(Msg::ProbeEnded);
                Event::RankProbeFailed { error }
            },
            move || {
                jobs::probe_job(&config, &base, &ranks, token_budget, &control, &out, || {
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
