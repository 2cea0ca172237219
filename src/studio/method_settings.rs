//! The training method on the LoRA settings page: SFT, DPO, ORPO or GRPO with the parameters each uses (beta;
//! DPO's loss and label smoothing; GRPO's sampling, objective and rewards, in `grpo_fields.rs` and
//! `reward_editor.rs`), checked by the engine's own `PreferenceSettings::validate` / `GrpoSettings::validate` with
//! its message shown inline; and the one check of the method against the open dataset (preference pairs train with DPO or ORPO,
//! other rows with SFT), shown with a one-click switch here and beside the Start button, and refused on start
//! with the engine's words ([`fits_data`]).

use super::grpo_fields::{grpo_error, grpo_rows_ui};
use super::preference_fields::{preference_rows_ui, settings_error, settings_for};
use super::prefs::Prefs;
use super::setting_rows::row_ui;
use super::widgets::{banner_ui, card_ui, palette, Tone};
use crate::engine::train::{data_fit, Method, TrainConfig};
use crate::worker::{DatasetReport, SplitName};
use egui::{RichText, Ui};
use std::path::PathBuf;

/// The method row's help.
const METHOD_HELP: &str = "What the run trains for. SFT learns the answers of chat, prompt/completion or text rows. \
     DPO and ORPO train on preference pairs (a prompt with a chosen and a rejected answer) and learn to prefer the \
     chosen one. GRPO samples several answers to each prompt, scores them with rewards and reinforces the better \
     ones: it needs prompts and rewards, not answers to copy.";

/// The "Training method" card: the method, its parameters and what the engine says of them.
pub fn method_card_ui(ui: &mut Ui, prefs: &mut Prefs, report: Option<&DatasetReport>) {
    card_ui(ui, |ui| {
        ui.set_width(ui.available_width());
        ui.label(RichText::new("Training method").strong().size(15.0));
        ui.add_space(4.0);
        let cfg = &mut prefs.train;
        egui::Grid::new("method-grid").num_columns(2).spacing([14.0, 8.0]).show(ui, |ui| {
            row_ui(ui, "Method", METHOD_HELP, |ui| {
                for m in Method::ALL {
                    let label = m.name().to_uppercase();
                    if ui.radio(cfg.method == m, label).on_hover_text(m.describe()).clicked() {
                        switch_method(cfg, m);
                    }
                }
            });
            let mut settings = cfg.preference();
            preference_rows_ui(ui, cfg.method, &mut settings);
            (cfg.beta, cfg.preference_loss, cfg.label_smoothing) =
                (settings.beta, settings.loss, settings.label_smoothing);
            if cfg.method == Method::Grpo {
                grpo_rows_ui(ui, &mut cfg.grpo);
            }
        });
        if cfg.method == Method::Grpo {
            ui.add_space(4.0);
            super::reward_editor::reward_editor_ui(ui, &mut cfg.grpo.rewards);
        }
        ui.label(RichText::new(cfg.method.describe()).weak().small());
        // The engine's own check, worded as the CLI prints it.
        let grpo = (cfg.method == Method::Grpo).then(|| grpo_error(&cfg.grpo)).flatten();
        if let Some(e) = settings_error(cfg.method, &cfg.preference()).or(grpo) {
            ui.label(RichText::new(e).color(palette::WARN));
        }
        if let Some(mismatch) = method_mismatch(cfg, prefs.dataset.as_ref(), report) {
            mismatch_ui(ui, &mut prefs.train, &mismatch);
        }
    });
}

/// Change the method, leaving settings the new one refuses (and no control shows) at values it accepts: ORPO has no
/// DPO loss, and preference methods and GRPO never train prompt tokens.
pub fn switch_method(cfg: &mut TrainConfig, method: Method) {
    cfg.method = method;
    let s = settings_for(method, cfg.preference());
    (cfg.preference_loss, cfg.label_smoothing) = (s.loss, s.label_smoothing);
    // Neither preference methods nor GRPO train prompt tokens (training refuses the setting for their data).
    if method.is_preference() || method.is_reinforcement() {
        cfg.train_on_prompt = false;
    }
    // Packing joins SFT rows; the other methods read whole rows of their own.
    if method != Method::Sft {
        cfg.packing = false;
    }
}

/// The method does not fit the open dataset: the engine's refusal and the method that fits.
#[derive(Debug, Clone, PartialEq)]
pub struct Mismatch {
    pub message: String,
    pub fits: Method,
}

/// Whether the method fits the open dataset, by the engine's rule (`check_method_fits_rows`) on the training
/// split's format from the dataset report; None while no report of `dataset` is known.
pub fn method_mismatch(
    cfg: &TrainConfig,
    dataset: Option<&PathBuf>,
    report: Option<&DatasetReport>,
) -> Option<Mismatch> {
    let report = report.filter(|r| dataset.is_some_and(|d| crate::worker::same_path(d, &r.path)))?;
    let format = report.splits.iter().find(|s| s.split == SplitName::Train)?.format?;
    let err = data_fit::check_method_fits_rows(cfg.method, format, &report.path).err()?;
    Some(Mismatch { message: err.to_string(), fits: data_fit::method_for(format.kind()) })
}

/// The mismatch as a warning with its one-click fix.
pub fn mismatch_ui(ui: &mut Ui, cfg: &mut TrainConfig, mismatch: &Mismatch) {
    let what = match mismatch.fits {
        Method::Dpo | Method::Orpo => "This dataset holds preference pairs",
        Method::Grpo => "This dataset holds prompts for GRPO",
        Method::Sft => "This dataset holds supervised rows",
    };
    banner_ui(ui, Tone::Warn, format!("{what}: {} cannot train on it.", cfg.method.name().to_uppercase()));
    ui.horizontal_wrapped(|ui| {
        let label = format!("Switch to {}", mismatch.fits.name().to_uppercase());
        if ui.button(label).on_hover_text(mismatch.fits.describe()).clicked() {
            switch_method(cfg, mismatch.fits);
        }
        // The engine's refusal, as a run started anyway would fail with it.
        ui.label(RichText::new(&mismatch.message).weak().small());
    });
}

/// A configuration Start would run (`settings_panel::ready_config`'s), refused when its method does not fit the
/// open dataset, in the engine's words (the run itself would fail with them).
pub fn fits_data(cfg: TrainConfig, report: Option<&DatasetReport>) -> Result<TrainConfig, String> {
    match method_mismatch(&cfg, Some(&cfg.data), report) {
        Some(m) => Err(m.message),
        None => Ok(cfg),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::data::DatasetFormat;
    use crate::engine::train::PreferenceLoss;
    use crate::worker::SplitReport;

    fn report(format: DatasetFormat) -> DatasetReport {
        let split = SplitReport {
            split: SplitName::Train,
            path: "d/train.jsonl".into(),
            files: vec![],
            format: Some(format),
            detection: Default::default(),
            columns: vec![],
            unit: Default::default(),
            rows: 3,
            blank_lines: 0,
            problems: vec![],
            error: None,
        };
        DatasetReport { path: "d".into(), splits: vec![split], ..Default::default() }
    }

    #[test]
    fn the_method_must_fit_the_data_in_the_engines_words() {
        let data = PathBuf::from("d");
        let mut cfg = TrainConfig { train_on_prompt: true, ..TrainConfig::default() };
        let pairs = report(DatasetFormat::Preference);
        let m = method_mismatch(&cfg, Some(&data), Some(&pairs)).unwrap();
        assert_eq!(m.fits, Method::Dpo);
        assert!(m.message.contains(crate::engine::data::formats::PREFERENCE_NOT_SFT), "{}", m.message);
        assert!(method_mismatch(&cfg, Some(&PathBuf::from("other")), Some(&pairs)).is_none(), "a stale report");
        switch_method(&mut cfg, m.fits);
        assert!(cfg.method == Method::Dpo && !cfg.train_on_prompt);
        assert!(method_mismatch(&cfg, Some(&data), Some(&pairs)).is_none());
        let dpo = TrainConfig { data: data.clone(), ..cfg.clone() };
        assert!(fits_data(dpo.clone(), Some(&pairs)).is_ok());
        assert!(fits_data(TrainConfig { method: Method::Sft, ..dpo }, Some(&pairs)).is_err());
        let chat = report(DatasetFormat::Chat);
        let m = method_mismatch(&cfg, Some(&data), Some(&chat)).unwrap();
        assert!(m.fits == Method::Sft && m.message.contains("DPO and ORPO train on preference pairs"), "{m:?}");
        let prompts = report(DatasetFormat::Prompts);
        let m = method_mismatch(&cfg, Some(&data), Some(&prompts)).unwrap();
        assert!(m.fits == Method::Grpo && m.message.contains("train with --method grpo"), "{m:?}");
        let mut grpo = TrainConfig { train_on_prompt: true, ..cfg.clone() };
        switch_method(&mut grpo, m.fits);
        assert!(grpo.method == Method::Grpo && !grpo.train_on_prompt);
        assert!(method_mismatch(&grpo, Some(&data), Some(&prompts)).is_none());
        let m = method_mismatch(&grpo, Some(&data), Some(&chat)).unwrap();
        assert!(m.fits == Method::Sft && m.message.contains("GRPO needs prompts with answers"), "{m:?}");
        cfg.preference_loss = PreferenceLoss::Ipo;
        switch_method(&mut cfg, Method::Orpo);
        assert!(cfg.preference().validate(Method::Orpo).is_ok(), "ORPO drops DPO's loss");
    }
}
