//! The Evaluate page's choices and the one place they become an [`EvalSpec`]: the targets (the base, picked
//! checkpoints of the runs folder, added adapter folders), the prompt set (a split of the dataset open on the
//! dataset page, or another file), the task and its options. Everything the page can refuse before any work starts
//! is refused here, in words the page shows; the engine checks the data itself (rows, fields) once the job runs.
//! The preference task scores pairs with DPO or ORPO; its method and settings follow the picked checkpoints' run
//! when that run trained with one ([`adopt_run_method`]), as `metal-candle eval` takes them from run.json.

use crate::engine::data::ReadOptions;
use crate::engine::eval::preference::PreferenceTask;
use crate::engine::eval::{EvalSpec, EvalTarget, EvalTask, GenerateSettings};
use crate::engine::sampler::SamplingParams;
use crate::engine::train::{Method, PreferenceSettings, TrainConfig};
use crate::worker::{same_path, DatasetReport, RunInfo, SplitName};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The task picked on the page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum TaskChoice {
    #[default]
    Loss,
    Generate,
    MultipleChoice,
    Preference,
}

impl TaskChoice {
    pub const ALL: [TaskChoice; 4] =
        [TaskChoice::Loss, TaskChoice::Generate, TaskChoice::MultipleChoice, TaskChoice::Preference];

    /// The radio button's label.
    pub fn title(self) -> &'static str {
        match self {
            TaskChoice::Loss => "Loss",
            TaskChoice::Generate => "Generate",
            TaskChoice::MultipleChoice => "Multiple choice",
            TaskChoice::Preference => "Preference",
        }
    }

    /// What the task measures, for the hover text.
    pub fn explain(self) -> &'static str {
        match self {
            TaskChoice::Loss => {
                "Loss and perplexity on each row, templated and masked as training does: lower is better."
            }
            TaskChoice::Generate => {
                "Answer each row's prompt and score the answer against the row's reference: exact match, contains, \
                 token F1, an optional regex and an optional judge model."
            }
            TaskChoice::MultipleChoice => {
                "Rows {\"context\", \"choices\", \"gold\"}, or ARC, HellaSwag and MMLU columns as lm-eval maps them: \
                 the log-likelihood of each choice as lm-evaluation-harness computes it; acc and acc_norm."
            }
            TaskChoice::Preference => {
                "Preference pairs {\"prompt\", \"chosen\", \"rejected\"}: how often each target rewards the chosen \
                 answer above the rejected one, as DPO or ORPO measures it (TRL's rewards/accuracies, \
                 rewards/margins, logps/chosen, ...). DPO's reference is the base model."
            }
        }
    }
}

/// Where the prompts come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum DataChoice {
    /// A split of the dataset open on the dataset page.
    #[default]
    DatasetSplit,
    /// Another file (or folder), typed or picked.
    File,
}

/// The page's remembered choices (part of the persisted preferences).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EvalPrefs {
    pub task: TaskChoice,
    pub data: DataChoice,
    pub split: SplitName,
    /// The other file's path field.
    pub file: String,
    /// Rows per target at most; 0: all.
    pub limit: usize,
    pub max_tokens: usize,
    /// 0 is greedy.
    pub temperature: f64,
    /// An answer scores 1 on `regex` when it matches (empty: not scored).
    pub regex: String,
    /// A local model that scores each answer 1-10 (empty: no judge).
    pub judge: String,
    pub batch_size: usize,
    pub include_base: bool,
    /// Picked checkpoint folders (those no longer listed are ignored).
    pub checkpoints: Vec<PathBuf>,
    /// Adapter folders added with "Add adapter folder…".
    pub adapters: Vec<PathBuf>,
    /// The metric plotted against the step (empty: the task's first).
    pub plot_metric: String,
    /// The preference task's method (DPO or ORPO) and its parameters.
    pub method: Method,
    pub preference: PreferenceSettings,
}

impl Default for EvalPrefs {
    fn default() -> Self {
        Self {
            task: TaskChoice::Loss,
            data: DataChoice::DatasetSplit,
            split: SplitName::Test,
            file: String::new(),
            limit: 0,
            max_tokens: 128,
            temperature: 0.0,
            regex: String::new(),
            judge: String::new(),
            batch_size: 4,
            include_base: true,
            checkpoints: Vec::new(),
            adapters: Vec::new(),
            plot_metric: String::new(),
            method: Method::Dpo,
            preference: PreferenceSettings::default(),
        }
    }
}

/// What the setup needs to know beyond its own choices.
pub struct SetupContext<'a> {
    pub model_loaded: bool,
    pub model_loading: bool,
    /// The dataset open on the dataset page (its report), if any.
    pub dataset: Option<&'a DatasetReport>,
    /// The training settings (sequence length, seed, prompt tokens trained): a split and its rows are read as
    /// a run with these read them, unless a picked checkpoint's run recorded its own.
    pub train: &'a TrainConfig,
    pub runs: &'a [RunInfo],
}

/// The targets in report order: the base, then picked checkpoints by run and step, then added adapter folders.
pub fn targets(prefs: &EvalPrefs, runs: &[RunInfo]) -> Vec<EvalTarget> {
    let mut out = Vec::new();
    if prefs.include_base {
        out.push(EvalTarget::base());
    }
    for run in runs {
        for c in &run.checkpoints {
            if prefs.checkpoints.iter().any(|p| same_path(p, &c.path)) {
                out.push(EvalTarget::adapter(&c.path));
            }
        }
    }
    out.extend(prefs.adapters.iter().map(|a| EvalTarget::adapter(a)));
    out
}

/// The evaluation the page would start, or why it cannot start yet (a sentence saying what to do).
pub fn build_spec(prefs: &EvalPrefs, cx: &SetupContext<'_>) -> Result<EvalSpec, String> {
    if cx.model_loading {
        return Err("The model is still loading; evaluation starts once it is loaded.".into());
    }
    if !cx.model_loaded {
        return Err("No model is loaded. Load the base model on the Model page: every target is scored on it.".into());
    }
    let targets = targets(prefs, cx.runs);
    if targets.is_empty() {
        return Err("Nothing to evaluate: tick the base model, pick checkpoints, or add an adapter folder.".into());
    }
    if let Some(missing) = prefs.adapters.iter().find(|a| !a.is_dir()) {
        return Err(format!("The adapter folder {} does not exist; remove it from the list.", missing.display()));
    }
    let (data, split, read) = prompt_set(prefs, cx.dataset)?;
    if prefs.batch_size == 0 {
        return Err("The batch size must be at least 1.".into());
    }
    let task = match prefs.task {
        TaskChoice::Loss => EvalTask::Loss,
        TaskChoice::MultipleChoice => EvalTask::MultipleChoice,
        TaskChoice::Generate => EvalTask::Generate(generate_settings(prefs)?),
        TaskChoice::Preference => EvalTask::Preference(preference_task(prefs)?),
    };
    // As `metal-candle eval` does: the first picked checkpoint's run says how its rows were read and split.
    let config = picked_run_config(prefs, cx.runs).unwrap_or(cx.train);
    let spec = EvalSpec {
        task,
        data,
        split,
        read,
        limit: (prefs.limit > 0).then_some(prefs.limit),
        batch_size: prefs.batch_size,
        targets,
        ..EvalSpec::default()
    }
    .read_like(config);
    // The engine's own check of the settings (a bad regex, sampling out of range), before the job is sent.
    spec.check().map_err(|e| e.to_string())?;
    Ok(spec)
}

/// The run.json config of the first run with a picked checkpoint.
pub fn picked_run_config<'a>(prefs: &EvalPrefs, runs: &'a [RunInfo]) -> Option<&'a TrainConfig> {
    runs.iter()
        .filter(|r| r.checkpoints.iter().any(|c| prefs.checkpoints.iter().any(|p| same_path(p, &c.path))))
        .find_map(|r| r.config.as_ref())
}

/// Take the preference method and settings of a run that trained with one (an SFT run leaves them as they are).
pub fn adopt_run_method(prefs: &mut EvalPrefs, config: Option<&TrainConfig>) {
    if let Some(c) = config.filter(|c| c.method.is_preference()) {
        prefs.method = c.method;
        prefs.preference = c.preference();
    }
}

/// The preference task as picked, checked by the engine's own rule (the CLI's `--method/--beta/--loss` are
/// checked the same way).
fn preference_task(prefs: &EvalPrefs) -> Result<PreferenceTask, String> {
    if !prefs.method.is_preference() {
        return Err("Pick DPO or ORPO: the preference task scores pairs as one of them does.".into());
    }
    prefs.preference.validate(prefs.method).map_err(|e| e.to_string())?;
    Ok(PreferenceTask { method: prefs.method, settings: prefs.preference })
}

/// The data path, split and read options of the prompt set.
fn prompt_set(prefs: &EvalPrefs, dataset: Option<&DatasetReport>) -> Result<(PathBuf, SplitName, ReadOptions), String> {
    match prefs.data {
        DataChoice::DatasetSplit => {
            let Some(report) = dataset else {
                return Err("No dataset is open. Open one on the Dataset page, or pick another file below.".into());
            };
            if report.rows(prefs.split) == 0 {
                let have: Vec<&str> = [SplitName::Train, SplitName::Valid, SplitName::Test]
                    .into_iter()
                    .filter(|s| report.rows(*s) > 0)
                    .map(|s| s.as_str())
                    .collect();
                return Err(format!(
                    "The dataset {} has no {} split; pick {} instead.",
                    report.path.display(),
                    prefs.split,
                    if have.is_empty() { "another file".to_string() } else { have.join(" or ") }
                ));
            }
            Ok((report.path.clone(), prefs.split, report.read.clone()))
        }
        DataChoice::File => {
            let typed = prefs.file.trim();
            if typed.is_empty() {
                return Err("Name the prompt file (type its path or use Browse…).".into());
            }
            let path = PathBuf::from(typed);
            if !path.exists() {
                return Err(format!("{} does not exist.", path.display()));
            }
            // A single file is its own split; the CLI passes its default (`--split test`) in the same case.
            Ok((path, SplitName::Test, ReadOptions::default()))
        }
    }
}

/// The generate task's settings, as `metal-candle eval` makes them (greedy at temperature 0, seed 42); the spec's
/// check validates them.
fn generate_settings(prefs: &EvalPrefs) -> Result<GenerateSettings, String> {
    let sampling = SamplingParams { temperature: prefs.temperature, seed: 42, ..SamplingParams::greedy() };
    let judge = Some(prefs.judge.trim()).filter(|j| !j.is_empty()).map(PathBuf::from);
    if let Some(j) = judge.as_deref().filter(|j| !j.exists()) {
        return Err(format!("The judge model {} does not exist.", j.display()));
    }
    let regex = Some(prefs.regex.trim()).filter(|r| !r.is_empty()).map(String::from);
    Ok(GenerateSettings { max_tokens: prefs.max_tokens, sampling, regex, judge })
}

/// Tick or untick a checkpoint folder.
pub fn toggle(list: &mut Vec<PathBuf>, path: &Path, on: bool) {
    list.retain(|p| !same_path(p, path));
    if on {
        list.push(path.to_path_buf());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::CheckpointInfo;

    fn run(dir: &Path, steps: &[usize]) -> RunInfo {
        RunInfo {
            name: dir.file_name().unwrap().to_string_lossy().into_owned(),
            label: None,
            notes: Default::default(),
            best_checkpoint: None,
            dir: dir.to_path_buf(),
            config: None,
            started_unix_secs: None,
            train_loss: vec![],
            val_loss: vec![],
            total_steps: None,
            trainable_params: None,
            status: crate::engine::train::run_folder::RunStatus::Finished,
            checkpoints: steps
                .iter()
                .map(|s| CheckpointInfo {
                    step: *s,
                    path: dir.join(format!("checkpoint-{s}")),
                    size_bytes: 0,
                    train_loss: None,
                    val_loss: None,
                    saved_unix_secs: 0,
                })
                .collect(),
        }
    }

    fn cx<'a>(runs: &'a [RunInfo], train: &'a TrainConfig) -> SetupContext<'a> {
        SetupContext { model_loaded: true, model_loading: false, dataset: None, train, runs }
    }

    fn train() -> TrainConfig {
        TrainConfig { seq_len: 256, ..TrainConfig::default() }
    }

    #[test]
    fn refusals_say_what_to_do() {
        let (runs, t) = ([], train());
        let prefs = EvalPrefs::default();
        let mut c = cx(&runs, &t);
        c.model_loaded = false;
        assert!(build_spec(&prefs, &c).unwrap_err().contains("Model page"));
        c.model_loading = true;
        assert!(build_spec(&prefs, &c).unwrap_err().contains("still loading"));
        let none = EvalPrefs { include_base: false, ..EvalPrefs::default() };
        assert!(build_spec(&none, &cx(&runs, &t)).unwrap_err().contains("Nothing to evaluate"));
        assert!(build_spec(&prefs, &cx(&runs, &t)).unwrap_err().contains("No dataset is open"));
        let file = EvalPrefs { data: DataChoice::File, file: "/no/such/file.jsonl".into(), ..EvalPrefs::default() };
        assert!(build_spec(&file, &cx(&runs, &t)).unwrap_err().contains("/no/such/file.jsonl does not exist"));
        let here = env!("CARGO_MANIFEST_DIR").to_string() + "/assets/sample-chat/valid.jsonl";
        let hot = EvalPrefs { task: TaskChoice::Generate, temperature: -1.0, file: here.clone(), ..file.clone() };
        assert!(build_spec(&hot, &cx(&runs, &t)).unwrap_err().contains("emperature"));
        let judge = EvalPrefs { temperature: 0.0, judge: "/no/judge".into(), ..hot };
        assert!(build_spec(&judge, &cx(&runs, &t)).unwrap_err().contains("judge model /no/judge"));
        let ok = EvalPrefs { judge: String::new(), limit: 3, ..judge };
        let spec = build_spec(&ok, &cx(&runs, &t)).unwrap();
        assert_eq!((spec.limit, spec.seq_len, spec.task.name()), (Some(3), 256, "generate"));
    }

    #[test]
    fn targets_come_base_first_then_checkpoints_by_run_and_step_then_adapters() {
        let tmp = tempfile::tempdir().unwrap();
        let mut runs = [run(&tmp.path().join("run-a"), &[10, 20]), run(&tmp.path().join("run-b"), &[5])];
        let t = train();
        let mut prefs = EvalPrefs::default();
        toggle(&mut prefs.checkpoints, &tmp.path().join("run-b/checkpoint-5"), true);
        toggle(&mut prefs.checkpoints, &tmp.path().join("run-a/checkpoint-20"), true);
        toggle(&mut prefs.checkpoints, &tmp.path().join("run-a/checkpoint-99"), true);
        prefs.adapters.push(tmp.path().join("my-adapter"));
        let labels: Vec<String> = targets(&prefs, &runs).into_iter().map(|t| t.label).collect();
        assert_eq!(labels, ["base", "run-a/checkpoint-20", "run-b/checkpoint-5", "my-adapter"]);
        toggle(&mut prefs.checkpoints, &tmp.path().join("run-a/checkpoint-20"), false);
        assert_eq!(targets(&prefs, &runs).len(), 3);
        let err = build_spec(&prefs, &cx(&runs, &t)).unwrap_err();
        assert!(err.contains("my-adapter does not exist"), "{err}");

        // A picked checkpoint's run says how rows are read, as `metal-candle eval` takes it from run.json.
        prefs.adapters.clear();
        prefs.data = DataChoice::File;
        prefs.file = env!("CARGO_MANIFEST_DIR").to_string() + "/assets/sample-chat/valid.jsonl";
        let spec = build_spec(&prefs, &cx(&runs, &t)).unwrap();
        assert_eq!(
            (spec.seq_len, spec.seed, spec.train_on_prompt),
            (256, t.seed, false),
            "no run config: the settings"
        );
        runs[1].config = Some(TrainConfig { seq_len: 77, seed: 7, train_on_prompt: true, ..TrainConfig::default() });
        let spec = build_spec(&prefs, &cx(&runs, &t)).unwrap();
        assert_eq!((spec.seq_len, spec.seed, spec.train_on_prompt), (77, 7, true));

        // The preference task takes an ORPO run's method and beta, and refuses what the engine refuses.
        let orpo = TrainConfig { method: Method::Orpo, beta: 0.25, ..TrainConfig::default() };
        runs[1].config = Some(orpo);
        prefs.task = TaskChoice::Preference;
        let picked = picked_run_config(&prefs, &runs);
        adopt_run_method(&mut prefs, picked);
        let spec = build_spec(&prefs, &cx(&runs, &t)).unwrap();
        match spec.task {
            EvalTask::Preference(task) => assert_eq!((task.method, task.settings.beta), (Method::Orpo, 0.25)),
            other => panic!("not a preference task: {other:?}"),
        }
        prefs.preference.beta = 0.0;
        assert!(build_spec(&prefs, &cx(&runs, &t)).unwrap_err().contains("beta (--beta) is 0"));
    }
}
