//! The runs table: several runs' settings and results side by side, one row per setting, one column per run,
//! each row marked when its values differ between the runs. One home for which settings are compared, how
//! each is written and what "differs" means: `runs show` prints it and the checkpoints page draws it.

use super::run_folder::RunInfo;
use crate::engine::model::chat_template::strftime::DateTime;
use std::path::Path;

/// One setting across the runs.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunTableRow {
    /// What the row is: "rank", "learning rate".
    pub setting: String,
    /// One value per run, in the table's run order; "–" where a run does not say.
    pub values: Vec<String>,
    /// The values are not all the same (never set for a table of one run).
    pub differs: bool,
}

/// Runs side by side.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunTable {
    /// Each column's heading: the run's title (its label, else its folder name).
    pub runs: Vec<String>,
    pub rows: Vec<RunTableRow>,
}

impl RunTable {
    /// The rows whose values differ, or all rows.
    pub fn rows(&self, only_differences: bool) -> impl Iterator<Item = &RunTableRow> {
        self.rows.iter().filter(move |r| r.differs || !only_differences)
    }

    /// The table as aligned plain text: a header line, then one line per row, differing rows marked `*`.
    pub fn to_text(&self, only_differences: bool) -> String {
        let rows: Vec<&RunTableRow> = self.rows(only_differences).collect();
        let width = |i: usize| {
            let values = rows.iter().map(|r| r.values[i].chars().count());
            values.chain([self.runs[i].chars().count()]).max().unwrap_or(0).min(COLUMN_MAX_CHARS)
        };
        let widths: Vec<usize> = (0..self.runs.len()).map(width).collect();
        let setting_width = rows.iter().map(|r| r.setting.len()).max().unwrap_or(0).max("setting".len());
        let line = |mark: &str, setting: &str, values: &[String]| {
            let cells: Vec<String> =
                values.iter().zip(&widths).map(|(v, w)| format!("{:<w$}", clip(v), w = *w)).collect();
            format!("{mark} {setting:<setting_width$}  {}", cells.join("  ")).trim_end().to_string() + "\n"
        };
        let mut out = line(" ", "setting", &self.runs);
        for row in rows {
            out.push_str(&line(if row.differs { "*" } else { " " }, &row.setting, &row.values));
        }
        out
    }
}

/// Longest cell in the text table; longer values (paths, notes) end in "…".
const COLUMN_MAX_CHARS: usize = 40;

fn clip(value: &str) -> String {
    let one_line = value.replace('\n', " ");
    if one_line.chars().count() <= COLUMN_MAX_CHARS {
        return one_line;
    }
    one_line.chars().take(COLUMN_MAX_CHARS - 1).collect::<String>() + "…"
}

/// The runs table of `runs`, in the order given.
pub fn run_table(runs: &[&RunInfo]) -> RunTable {
    let mut rows = Vec::new();
    let mut add = |setting: &str, value: &dyn Fn(&RunInfo) -> Option<String>| {
        let values: Vec<String> = runs.iter().map(|r| value(r).unwrap_or_else(|| DASH.into())).collect();
        let differs = values.windows(2).any(|w| w[0] != w[1]);
        rows.push(RunTableRow { setting: setting.into(), values, differs });
    };
    add("folder", &|r| Some(r.name.clone()));
    add("status", &|r| Some(r.status.to_string()));
    add("notes", &|r| r.notes.clone());
    add("model", &|r| r.config.as_ref().map(|c| file_name(&c.model)));
    add("dataset", &|r| r.config.as_ref().map(|c| file_name(&c.data)));
    add("method", &|r| r.config.as_ref().map(method_text));
    add("rank", &|r| r.config.as_ref().map(|c| c.lora.rank.to_string()));
    add("alpha", &|r| r.config.as_ref().map(|c| c.lora.alpha.to_string()));
    add("rsLoRA", &|r| r.config.as_ref().map(|c| yes_no(c.lora.use_rslora)));
    add("dropout", &|r| r.config.as_ref().map(|c| c.lora.dropout.to_string()));
    add("targets", &|r| r.config.as_ref().map(|c| c.lora.targets.to_string()));
    add("layers", &|r| r.config.as_ref().map(|c| c.lora.layers.map_or("all".into(), |n| format!("last {n}"))));
    add("learning rate", &|r| r.config.as_ref().map(|c| format!("{:e}", c.lr)));
    add("schedule", &|r| r.config.as_ref().map(|c| format!("{:?}", c.schedule).to_lowercase()));
    add("warmup", &|r| r.config.as_ref().map(|c| c.warmup.map_or("auto".into(), |w| w.to_string())));
    add("weight decay", &|r| r.config.as_ref().map(|c| c.weight_decay.to_string()));
    add("max grad norm", &|r| r.config.as_ref().map(|c| c.max_grad_norm.map_or("off".into(), |n| n.to_string())));
    add("batch", &|r| r.config.as_ref().map(|c| c.batch_size.to_string()));
    add("grad accum", &|r| r.config.as_ref().map(|c| c.grad_accum.to_string()));
    add("seq len", &|r| r.config.as_ref().map(|c| c.seq_len.to_string()));
    add("epochs / iters", &|r| r.config.as_ref().map(duration));
    add("train on prompt", &|r| r.config.as_ref().map(|c| yes_no(c.train_on_prompt)));
    add("base weights", &|r| r.config.as_ref().map(|c| c.quantize.to_string()));
    add("seed", &|r| r.config.as_ref().map(|c| c.seed.to_string()));
    add("early stopping", &|r| r.config.as_ref().map(early_stopping));
    add("checkpoint limit", &|r| r.config.as_ref().map(|c| c.save_total_limit.map_or("all".into(), |n| n.to_string())));
    add("trainable params", &|r| r.trainable_params.map(|p| p.to_string()));
    add("steps done", &|r| Some(steps_done(r)));
    add("final train loss", &|r| r.train_loss.last().map(|p| format!("{:.4}", p[1])));
    add("best val loss", &|r| best_val_loss(r).map(|(step, loss)| format!("{loss:.4} (step {step})")));
    add("checkpoints", &|r| Some(r.checkpoints.len().to_string()));
    add("started", &|r| r.started_unix_secs.filter(|&t| t > 0).map(utc_text));
    RunTable { runs: runs.iter().map(|r| r.title().to_string()).collect(), rows }
}

const DASH: &str = "–";

/// Steps done "12 / 40": the last logged step, and the planned total when the run said.
pub fn steps_done(run: &RunInfo) -> String {
    let done = run.train_loss.last().map(|p| p[0] as usize).or(run.checkpoints.iter().map(|c| c.step).max());
    match (done, run.total_steps) {
        (Some(d), Some(t)) => format!("{d} / {t}"),
        (Some(d), None) => d.to_string(),
        (None, Some(t)) => format!("0 / {t}"),
        (None, None) => DASH.into(),
    }
}

/// The best checkpoint's validation loss and step (run.json's `best_checkpoint`), else the lowest validation loss
/// logged and its step.
pub fn best_val_loss(run: &RunInfo) -> Option<(usize, f64)> {
    if let Some(best) = &run.best_checkpoint {
        return Some((best.step, best.val_loss));
    }
    run.val_loss.iter().filter(|p| p[1].is_finite()).min_by(|a, b| a[1].total_cmp(&b[1])).map(|p| (p[0] as usize, p[1]))
}

/// The training method with the parameters it uses: "sft", "dpo · beta 0.1 · sigmoid", "orpo · beta 0.1",
/// "grpo · 8 per prompt · dapo" (what
/// the runs table, the studio's run list and its training page show).
pub fn method_text(c: &super::TrainConfig) -> String {
    use super::method::{Method, PreferenceLoss};
    match c.method {
        Method::Sft => "sft".into(),
        Method::Orpo => format!("orpo · beta {}", c.beta),
        Method::Dpo => {
            let smoothing = match (c.preference_loss, c.label_smoothing) {
                (PreferenceLoss::Sigmoid, s) if s > 0.0 => format!(", label smoothing {s}"),
                _ => String::new(),
            };
            format!("dpo · beta {} · {}{smoothing}", c.beta, c.preference_loss.name())
        }
        Method::Grpo => {
            let g = &c.grpo;
            let kl = if g.beta > 0.0 { format!(" · beta {}", g.beta) } else { String::new() };
            format!("grpo · {} per prompt · {}{kl}", g.num_generations, g.loss.name())
        }
    }
}

fn early_stopping(c: &super::TrainConfig) -> String {
    match c.early_stopping_patience {
        0 => "off".into(),
        n if c.early_stopping_min_delta > 0.0 => format!("patience {n}, min delta {}", c.early_stopping_min_delta),
        n => format!("patience {n}"),
    }
}

fn duration(c: &super::TrainConfig) -> String {
    match (c.iters, c.epochs) {
        (Some(n), _) => format!("{n} iters"),
        (None, Some(e)) => format!("{e} epochs"),
        (None, None) => DASH.into(),
    }
}

fn yes_no(flag: bool) -> String {
    (if flag { "yes" } else { "no" }).into()
}

/// A model or dataset path as its last part (the folder or file name): what tells runs apart in a column.
fn file_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| path.display().to_string())
}

/// "2026-11-28 06:44 UTC".
fn utc_text(secs: u64) -> String {
    let t = DateTime::from_unix_secs(secs as i64);
    format!("{:04}-{:02}-{:02} {:02}:{:02} UTC", t.year, t.month, t.day, t.hour, t.minute)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::train::run_folder::RunStatus;
    use crate::engine::train::TrainConfig;

    fn info(name: &str, rank: usize) -> RunInfo {
        let mut config = TrainConfig::default();
        config.lora.rank = rank;
        RunInfo {
            name: name.into(),
            label: None,
            notes: None,
            best_checkpoint: None,
            dir: name.into(),
            config: Some(config),
            started_unix_secs: Some(0),
            train_loss: vec![[1.0, 2.0], [2.0, 1.5]],
            val_loss: vec![[1.0, 1.9], [2.0, 1.7]],
            total_steps: Some(2),
            trainable_params: Some(10),
            status: RunStatus::Finished,
            checkpoints: vec![],
        }
    }

    #[test]
    fn differing_rows_are_marked_and_filtered() {
        let (a, b) = (info("a", 4), info("b", 8));
        let table = run_table(&[&a, &b]);
        let row = |s: &str| table.rows.iter().find(|r| r.setting == s).unwrap();
        assert_eq!((row("rank").values.clone(), row("rank").differs), (vec!["4".into(), "8".into()], true));
        assert!(!row("learning rate").differs);
        assert_eq!(row("best val loss").values[0], "1.7000 (step 2)");
        assert_eq!(row("steps done").values[0], "2 / 2");
        assert_eq!(row("method").values[0], "sft");
        let dpo = TrainConfig {
            method: crate::engine::train::method::Method::Dpo,
            label_smoothing: 0.1,
            ..Default::default()
        };
        assert_eq!(method_text(&dpo), "dpo · beta 0.1 · sigmoid, label smoothing 0.1");
        let only: Vec<&str> = table.rows(true).map(|r| r.setting.as_str()).collect();
        assert_eq!(only, ["folder", "rank"]);
        let text = table.to_text(false);
        assert!(text.lines().any(|l| l.starts_with("* rank") && l.contains('4') && l.contains('8')), "{text}");
        assert!(text.lines().any(|l| l.starts_with("  seed")), "{text}");
        assert!(!run_table(&[&a]).rows.iter().any(|r| r.differs), "one run differs from nothing");
    }
}
