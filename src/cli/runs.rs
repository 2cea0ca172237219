//! `metal-candle runs`: the checkpoints page's run management on the command line. `list` (one line per run),
//! `show` (runs side by side, the engine's `run_table`, differing rows marked), `rename`, `note` and `delete`
//! (the engine's `run_delete`, with the same refusals the studio gives, after a confirmation).

use crate::engine::train::run_delete::{delete_run, plan_run_delete};
use crate::engine::train::run_folder::{list_runs, RunInfo, RUN_CONFIG};
use crate::engine::train::run_label::{rename_run, set_run_notes};
use crate::engine::train::run_table::{best_val_loss, run_table, steps_done};
use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};

#[derive(Debug, Subcommand)]
pub enum RunsCommand {
    /// One line per run, newest first: folder, name, status, steps, final and best loss, notes.
    List(ListArgs),
    /// Runs side by side: each setting on a row, rows whose values differ marked with `*`.
    Show(ShowArgs),
    /// Give a run a name of its own (stored in its run.json; the folder keeps its name).
    Rename(RenameArgs),
    /// Store a free-text note on a run (in its run.json); an empty TEXT clears it.
    Note(NoteArgs),
    /// Delete a run folder with its checkpoints, after saying what goes (refused while it trains).
    Delete(DeleteArgs),
}

/// Where the runs are.
#[derive(Debug, Args)]
pub struct RunsDir {
    /// The runs folder.
    #[arg(long = "dir", default_value = "runs")]
    pub dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub runs: RunsDir,
    /// Print the list as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// Runs: folder names inside --dir, names given with `rename`, or paths to run folders.
    #[arg(required = true)]
    pub run: Vec<String>,
    #[command(flatten)]
    pub runs: RunsDir,
    /// Only the rows whose values differ.
    #[arg(long)]
    pub only_differences: bool,
    /// Print the table as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct RenameArgs {
    pub run: String,
    pub label: String,
    #[command(flatten)]
    pub runs: RunsDir,
}

#[derive(Debug, Args)]
pub struct NoteArgs {
    pub run: String,
    pub text: String,
    #[command(flatten)]
    pub runs: RunsDir,
}

#[derive(Debug, Args)]
pub struct DeleteArgs {
    pub run: String,
    /// Delete without asking.
    #[arg(long)]
    pub yes: bool,
    #[command(flatten)]
    pub runs: RunsDir,
}

pub fn run(command: RunsCommand) -> anyhow::Result<()> {
    match command {
        RunsCommand::List(a) => list(&a),
        RunsCommand::Show(a) => show(&a),
        RunsCommand::Rename(a) => {
            let run = find_run(&a.runs.dir, &a.run)?;
            let label = rename_run(&run.dir, &a.label)?;
            println!("{}: named \"{label}\"", run.name);
            Ok(())
        }
        RunsCommand::Note(a) => {
            let run = find_run(&a.runs.dir, &a.run)?;
            match set_run_notes(&run.dir, &a.text)? {
                Some(_) => println!("{}: note saved", run.name),
                None => println!("{}: note cleared", run.name),
            }
            Ok(())
        }
        RunsCommand::Delete(a) => delete(&a),
    }
}

fn all_runs(dir: &Path) -> anyhow::Result<Vec<RunInfo>> {
    if !dir.is_dir() {
        bail!("the runs folder {} does not exist; pass --dir with the folder `train --out` wrote to", dir.display());
    }
    Ok(list_runs(dir)?)
}

/// A run by folder name, by the name given with `rename` (when one run has it), or by path.
fn find_run(dir: &Path, wanted: &str) -> anyhow::Result<RunInfo> {
    let path = Path::new(wanted);
    if path.join(RUN_CONFIG).is_file() && (path.is_absolute() || wanted.contains(std::path::MAIN_SEPARATOR)) {
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let runs = list_runs(parent)?;
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if let Some(run) = runs.into_iter().find(|r| r.name == name) {
            return Ok(run);
        }
    }
    let runs = all_runs(dir)?;
    if let Some(run) = runs.iter().find(|r| r.name == wanted) {
        return Ok(run.clone());
    }
    let labelled: Vec<&RunInfo> = runs.iter().filter(|r| r.label.as_deref() == Some(wanted)).collect();
    match labelled.as_slice() {
        [one] => Ok((*one).clone()),
        [] => bail!(
            "no run {wanted:?} in {} (runs there: {}); give a folder name, a run's name or a path",
            dir.display(),
            runs.iter().map(|r| r.name.as_str()).collect::<Vec<_>>().join(", ")
        ),
        many => bail!(
            "{} runs are named {wanted:?} ({}); give the folder name instead",
            many.len(),
            many.iter().map(|r| r.name.as_str()).collect::<Vec<_>>().join(", ")
        ),
    }
}

fn list(args: &ListArgs) -> anyhow::Result<()> {
    let runs = all_runs(&args.runs.dir)?;
    if args.json {
        let rows: Vec<serde_json::Value> = runs
            .iter()
            .map(|r| {
                serde_json::json!({
                    "name": r.name,
                    "label": r.label,
                    "dir": r.dir,
                    "status": r.status.label(),
                    "steps": steps_done(r),
                    "total_steps": r.total_steps,
                    "final_train_loss": r.train_loss.last().map(|p| p[1]),
                    "best_val_loss": best_val_loss(r).map(|(step, loss)| serde_json::json!({"step": step, "val_loss": loss})),
                    "checkpoints": r.checkpoints.len(),
                    "notes": r.notes,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    if runs.is_empty() {
        println!("no runs in {}", args.runs.dir.display());
        return Ok(());
    }
    println!(
        "{:<28} {:<24} {:<10} {:>11} {:>10} {:>16}  notes",
        "folder", "name", "status", "steps", "train", "best val"
    );
    for r in &runs {
        let train = r.train_loss.last().map_or("–".into(), |p| format!("{:.4}", p[1]));
        let best = best_val_loss(r).map_or("–".into(), |(s, l)| format!("{l:.4} @{s}"));
        let notes = r.notes.as_deref().map(|n| n.lines().next().unwrap_or_default()).unwrap_or("");
        let label = r.label.as_deref().unwrap_or("");
        println!(
            "{:<28} {label:<24} {:<10} {:>11} {train:>10} {best:>16}  {notes}",
            r.name,
            r.status.label(),
            steps_done(r)
        );
    }
    Ok(())
}

fn show(args: &ShowArgs) -> anyhow::Result<()> {
    let runs = args.run.iter().map(|r| find_run(&args.runs.dir, r)).collect::<anyhow::Result<Vec<_>>>()?;
    let table = run_table(&runs.iter().collect::<Vec<_>>());
    if args.json {
        println!("{}", serde_json::to_string_pretty(&table)?);
    } else {
        print!("{}", table.to_text(args.only_differences));
        if runs.len() > 1 {
            println!("(* the runs differ)");
        }
    }
    Ok(())
}

fn delete(args: &DeleteArgs) -> anyhow::Result<()> {
    // A folder that is not a run (or not in the runs folder) gets the engine's refusal, which says why.
    let run_dir = match find_run(&args.runs.dir, &args.run) {
        Ok(run) => run.dir,
        Err(_) if Path::new(&args.run).is_dir() => PathBuf::from(&args.run),
        Err(e) => return Err(e),
    };
    let plan = plan_run_delete(&args.runs.dir, &run_dir)?;
    let what = format!(
        "{}: the folder {}, {} checkpoint(s), {:.1} MiB",
        plan.title,
        plan.run_dir.display(),
        plan.checkpoints,
        plan.size_bytes as f64 / (1u64 << 20) as f64
    );
    if !args.yes {
        if !std::io::stdin().is_terminal() {
            bail!("would delete {what}; pass --yes to delete without a terminal to confirm on");
        }
        print!("Delete {what}? This cannot be undone. [y/N] ");
        std::io::stdout().flush()?;
        let mut answer = String::new();
        std::io::stdin().lock().read_line(&mut answer).context("reading the answer")?;
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            println!("kept");
            return Ok(());
        }
    }
    delete_run(&args.runs.dir, &plan.run_dir)?;
    println!("deleted {what}");
    Ok(())
}
