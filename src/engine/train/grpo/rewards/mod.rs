//! GRPO's rewards: the specs in `GrpoSettings::rewards` compiled into scorers, checked before training, and run
//! on every sampled completion.
//!
//! - `answer.rs`: which part of a completion is its answer, and when two answers are equal (exact-answer).
//! - `builtin.rs`: exact-answer, regex, format and length.
//! - `program.rs`: the user's reward program (its JSON line, its score, its errors); `process.rs` runs one child
//!   with a timeout and kills it cleanly.
//! - `spec.rs`: `--reward SPEC` (`length=200@0.5`) as a [`RewardSpec`].
//!
//! Every completion gets one value per reward (unweighted) and their weighted sum. A reward program's failure
//! ends the run with an error naming the row; it is never a score.

pub mod answer;
pub mod builtin;
mod process;
pub mod program;
mod spec;

use super::settings::{reward_names, RewardKind, RewardSpec};
use crate::engine::data::formats::PromptRow;
use crate::engine::{Error, Result};
use builtin::Builtin;
use program::Program;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// The flag built-in rewards come from, for messages.
const BUILTIN_FLAG: &str = "--reward";
/// The most reward programs run at the same time.
const MAX_PROGRAM_THREADS: usize = 4;
/// How often a cancel is looked for while programs run.
const CANCEL_POLL: Duration = Duration::from_millis(5);
/// How many rows a message about rows lists.
const LISTED_ROWS: usize = 5;

/// One completion to score.
#[derive(Debug, Clone, Copy)]
pub struct RewardInput<'a> {
    /// The prompt row the completion answers.
    pub row: &'a PromptRow,
    pub completion: &'a str,
    /// The completion's length in tokens (the length reward).
    pub completion_tokens: usize,
    /// Where the row is (`data/train.jsonl:17`), for messages.
    pub location: &'a str,
}

/// Scores for a batch of completions.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RewardTable {
    /// `values[i][k]`: reward `k` of completion `i`, unweighted.
    pub values: Vec<Vec<f64>>,
    /// `total[i]`: the weighted sum of completion `i`'s rewards.
    pub total: Vec<f64>,
}

/// The rewards of a run, compiled from their specs and ready to score.
#[derive(Debug, Clone)]
pub struct Rewards {
    names: Vec<String>,
    weights: Vec<f64>,
    scorers: Vec<Scorer>,
}

#[derive(Debug, Clone)]
enum Scorer {
    Builtin(Builtin),
    Program(Program),
}

impl Rewards {
    /// Compile the specs: regexes compiled, presets resolved, each program found (on PATH or as a path) and
    /// executable. A bad spec is an [`Error::InvalidSetting`] naming the reward and its flag.
    pub fn new(specs: &[RewardSpec]) -> Result<Self> {
        if specs.is_empty() {
            return Err(Error::InvalidSetting(
                "GRPO needs at least one reward (--reward exact-answer, say, or --reward-program)".into(),
            ));
        }
        let names = reward_names(specs);
        let scorers = specs
            .iter()
            .zip(&names)
            .map(|(spec, name)| {
                if !spec.weight.is_finite() {
                    return Err(Error::InvalidSetting(format!(
                        "reward {name}: its weight is {}; it must be a finite number",
                        spec.weight
                    )));
                }
                Ok(match &spec.kind {
                    RewardKind::ExactAnswer => Scorer::Builtin(Builtin::ExactAnswer),
                    RewardKind::Regex { pattern } => Scorer::Builtin(Builtin::regex(pattern, name, BUILTIN_FLAG)?),
                    RewardKind::Format { structure } => {
                        Scorer::Builtin(Builtin::format(structure, name, BUILTIN_FLAG)?)
                    }
                    RewardKind::Length { budget } => Scorer::Builtin(Builtin::length(*budget, name, BUILTIN_FLAG)?),
                    RewardKind::Program { command, timeout_secs } => {
                        Scorer::Program(Program::new(command, *timeout_secs, name)?)
                    }
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { names, weights: specs.iter().map(|s| s.weight).collect(), scorers })
    }

    /// Each reward's name in metrics (`rewards/<name>/mean`), in order ([`reward_names`]).
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Each reward's weight in the total, in order.
    pub fn weights(&self) -> Vec<f64> {
        self.weights.clone()
    }

    /// Whether a reward reads the rows' `answer` (exact-answer).
    pub fn needs_answer(&self) -> bool {
        self.scorers.iter().any(|s| matches!(s, Scorer::Builtin(Builtin::ExactAnswer)))
    }

    /// Refuse, before training, rows that an answer-reading reward cannot score (no `answer`, or a blank one):
    /// the message lists the first few rows' locations (`location(index)`) and how many there are.
    pub fn check_rows(&self, rows: &[PromptRow], location: &dyn Fn(usize) -> String) -> Result<()> {
        if !self.needs_answer() {
            return Ok(());
        }
        let missing: Vec<usize> = rows
            .iter()
            .enumerate()
            .filter(|(_, row)| row.answer.as_deref().and_then(answer::reference_answer).is_none())
            .map(|(i, _)| i)
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let listed: Vec<String> = missing.iter().take(LISTED_ROWS).map(|&i| location(i)).collect();
        let more =
            if missing.len() > LISTED_ROWS { format!(" and {} more", missing.len() - LISTED_ROWS) } else { "".into() };
        let readers: Vec<&str> = self
            .names
            .iter()
            .zip(&self.scorers)
            .filter(|(_, s)| matches!(s, Scorer::Builtin(Builtin::ExactAnswer)))
            .map(|(n, _)| n.as_str())
            .collect();
        Err(Error::Data(format!(
            "the {} reward compares completions with each row's `answer`, but {} of {} rows have none (or a blank \
             one): {}{more}; add an `answer` to those rows, or train with rewards that need none (--reward)",
            readers.join(", "),
            missing.len(),
            rows.len(),
            listed.join(", ")
        )))
    }

    /// Run each reward program once on `row` with an empty completion, before any training: a missing
    /// interpreter, a crash, a timeout or output that is not a number is reported now, not after the first
    /// generation.
    pub fn preflight(&self, row: &PromptRow, location: &str) -> Result<()> {
        let trial = format!("{location} (a trial call with an empty completion, before training)");
        let stop = AtomicBool::new(false);
        for scorer in &self.scorers {
            if let Scorer::Program(program) = scorer {
                program.score(row, "", &trial, &stop)?;
            }
        }
        Ok(())
    }

    /// Score every completion. `cancelled` is polled while reward programs run; a cancel kills them and returns
    /// [`Error::Cancelled`]. Programs run on up to four threads; the table keeps the inputs' order.
    pub fn score(&self, inputs: &[RewardInput], cancelled: &dyn Fn() -> bool) -> Result<RewardTable> {
        let mut values = vec![vec![0.0; self.scorers.len()]; inputs.len()];
        let mut jobs = Vec::new();
        for (k, scorer) in self.scorers.iter().enumerate() {
            match scorer {
                Scorer::Builtin(reward) => {
                    for (row, input) in values.iter_mut().zip(inputs) {
                        row[k] = reward.score(input.completion, input.completion_tokens, input.row.answer.as_deref());
                    }
                }
                Scorer::Program(program) => {
                    jobs.extend((0..inputs.len()).map(|i| Job { input: i, reward: k, program }))
                }
            }
        }
        for (job, score) in jobs.iter().zip(run_jobs(&jobs, inputs, cancelled)?) {
            values[job.input][job.reward] = score;
        }
        let total = values.iter().map(|v| v.iter().zip(&self.weights).map(|(v, w)| v * w).sum()).collect();
        Ok(RewardTable { values, total })
    }
}

/// One reward program call: completion `input`, reward `reward`.
struct Job<'a> {
    input: usize,
    reward: usize,
    program: &'a Program,
}

/// Run the program calls on a few threads, polling `cancelled` on this one. The first failure stops the rest (a
/// run with a failing reward ends) and is the error returned.
fn run_jobs(jobs: &[Job], inputs: &[RewardInput], cancelled: &dyn Fn() -> bool) -> Result<Vec<f64>> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    if cancelled() {
        return Err(Error::Cancelled);
    }
    let stop = AtomicBool::new(false);
    let next = AtomicUsize::new(0);
    let results: Vec<Mutex<Option<Result<f64>>>> = jobs.iter().map(|_| Mutex::new(None)).collect();
    let work = || loop {
        let t = next.fetch_add(1, Ordering::Relaxed);
        if t >= jobs.len() || stop.load(Ordering::Relaxed) {
            break;
        }
        let (job, input) = (&jobs[t], &inputs[jobs[t].input]);
        let result = job.program.score(input.row, input.completion, input.location, &stop);
        if result.is_err() {
            stop.store(true, Ordering::Relaxed);
        }
        if let Ok(mut slot) = results[t].lock() {
            *slot = Some(result);
        }
    };
    let threads = crate::engine::cpu_team::threads().min(MAX_PROGRAM_THREADS).min(jobs.len());
    let mut user_cancelled = false;
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .filter_map(|_| std::thread::Builder::new().name("reward-program".into()).spawn_scoped(scope, work).ok())
            .collect();
        if workers.is_empty() {
            // No thread could be started: run the calls here (a cancel is then seen only between calls).
            work();
        }
        while !workers.iter().all(|w| w.is_finished()) {
            if !user_cancelled && cancelled() {
                user_cancelled = true;
                stop.store(true, Ordering::Relaxed);
            }
            std::thread::sleep(CANCEL_POLL);
        }
    });
    if user_cancelled {
        return Err(Error::Cancelled);
    }
    let results: Vec<Option<Result<f64>>> = results.into_iter().map(|slot| slot.into_inner().ok().flatten()).collect();
    // The failure that stopped the others, not the calls it cut short.
    let failure = results.iter().position(|r| matches!(r, Some(Err(e)) if !matches!(e, Error::Cancelled)));
    let mut scores = Vec::with_capacity(results.len());
    for (t, result) in results.into_iter().enumerate() {
        match (failure, result) {
            (Some(f), Some(Err(e))) if f == t => return Err(e),
            (Some(_), _) => continue,
            (None, Some(result)) => scores.push(result?),
            (None, None) => return Err(Error::Cancelled),
        }
    }
    Ok(scores)
}
