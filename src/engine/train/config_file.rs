//! Training settings from a TOML file (run.json's field names, LoRA settings under `[lora]`). A key the
//! settings do not have is refused, naming it and the closest valid key, instead of being silently ignored
//! (`learning_rate = 0.5` would otherwise train at the default rate).

use super::config::TrainConfig;
use crate::engine::{Error, Result};
use std::path::Path;

/// Names other tools use for our settings.
const ALIASES: &[(&str, &str)] = &[
    ("learning_rate", "lr"),
    ("max_steps", "iters"),
    ("iterations", "iters"),
    ("num_train_epochs", "epochs"),
    ("num_epochs", "epochs"),
    ("per_device_train_batch_size", "batch_size"),
    ("gradient_accumulation_steps", "grad_accum"),
    ("warmup_steps", "warmup"),
    ("max_seq_length", "seq_len"),
    ("max_length", "seq_len"),
    ("lr_scheduler_type", "schedule"),
    ("output_dir", "out"),
    ("name", "run_name"),
    ("r", "lora.rank"),
    ("lora_alpha", "lora.alpha"),
    ("lora_dropout", "lora.dropout"),
    ("target_modules", "lora.targets"),
    ("loss_type", "preference_loss"),
    ("loss", "preference_loss"),
    ("use_dora", "lora.dora"),
];

impl TrainConfig {
    /// Read settings from a TOML file (same field names as run.json); unknown keys are refused.
    pub fn from_toml_file(path: &Path) -> Result<Self> {
        let text = crate::engine::error::read_to_string(path)?;
        let bad = |message: String| Error::InvalidSetting(format!("{}: {message}", path.display()));
        let table: toml::Table = toml::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let (top, lora) = known_keys();
        for key in table.keys() {
            if !top.contains(key) {
                return Err(bad(unknown_key(key, "", &top, &lora)));
            }
        }
        if let Some(toml::Value::Table(l)) = table.get("lora") {
            if let Some(key) = l.keys().find(|k| !lora.contains(k)) {
                return Err(bad(unknown_key(key, "lora.", &top, &lora)));
            }
        }
        toml::from_str(&text).map_err(|e| bad(e.to_string()))
    }

    /// Write these settings as a TOML file [`TrainConfig::from_toml_file`] reads back to the same settings (a run
    /// the studio hands to other processes).
    pub fn write_toml_file(&self, path: &Path) -> Result<()> {
        let text = toml::to_string(self).map_err(|e| Error::InvalidSetting(format!("settings as TOML: {e}")))?;
        std::fs::write(path, text).map_err(|e| Error::write(path, e))
    }
}

/// The top-level keys and the `[lora]` keys a settings file may use.
fn known_keys() -> (Vec<String>, Vec<String>) {
    let keys = |v: Option<&serde_json::Value>| -> Vec<String> {
        v.and_then(|v| v.as_object()).map(|o| o.keys().cloned().collect()).unwrap_or_default()
    };
    let value = serde_json::to_value(TrainConfig::default()).unwrap_or_default();
    let mut top = keys(Some(&value));
    top.push("force_base".into());
    (top, keys(value.get("lora")))
}

/// "unknown key `x`; did you mean `y`?" for a key found under `prefix` ("" or "lora.").
fn unknown_key(key: &str, prefix: &str, top: &[String], lora: &[String]) -> String {
    let candidates: Vec<String> =
        top.iter().filter(|k| *k != "lora").cloned().chain(lora.iter().map(|k| format!("lora.{k}"))).collect();
    let alias = ALIASES.iter().find(|(a, _)| *a == key).map(|(_, k)| k.to_string());
    let same_name = candidates.iter().find(|c| c.rsplit('.').next() == Some(key)).cloned();
    let closest = || {
        candidates
            .iter()
            .map(|c| (edit_distance(key, c.rsplit('.').next().unwrap_or(c)), c))
            .filter(|(d, _)| *d <= (key.len() / 3).max(2))
            .min_by_key(|(d, _)| *d)
            .map(|(_, c)| c.clone())
    };
    let hint = match alias.or(same_name).or_else(closest) {
        Some(k) => match k.strip_prefix("lora.") {
            Some(inner) => format!("; did you mean `{inner}` under `[lora]`?"),
            None => format!("; did you mean `{k}` (at the top level)?"),
        },
        None => format!("; valid keys: {}", candidates.join(", ")),
    };
    format!("unknown setting `{prefix}{key}`{hint}")
}

/// Levenshtein distance between two short strings.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::edit_distance;
    use crate::engine::train::TrainConfig;

    #[test]
    fn settings_written_as_toml_read_back_the_same() {
        let dir = std::env::temp_dir().join(format!("mc-toml-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut config = TrainConfig { run_name: Some("r".into()), batch_size: 8, ..TrainConfig::default() };
        config.model = "/models/m".into();
        config.resume = Some("/runs/r/checkpoint-4".into());
        config.lora.dora = true;
        let path = dir.join("run.toml");
        config.write_toml_file(&path).unwrap();
        assert_eq!(TrainConfig::from_toml_file(&path).unwrap(), config);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn dataset_reading_settings_come_from_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.toml");
        std::fs::write(
            &path,
            "data_format = \"completions\"\ndata_columns = { prompt = \"question\", completion = \"answer\" }\n",
        )
        .unwrap();
        let c = TrainConfig::from_toml_file(&path).unwrap();
        assert_eq!(c.read_options().describe(), "completions with columns completion=answer,prompt=question");
        std::fs::write(&path, "data_format = \"csv\"\n").unwrap();
        let err = TrainConfig::from_toml_file(&path).unwrap_err().to_string();
        assert!(err.contains("data_format") || err.contains("csv"), "{err}");
    }

    #[test]
    fn edit_distance_counts_edits() {
        assert_eq!(edit_distance("warmpu", "warmup"), 2);
        assert_eq!(edit_distance("seq_len", "seq_len"), 0);
        assert_eq!(edit_distance("", "lr"), 2);
    }
}
