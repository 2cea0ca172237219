//! The preference methods' parameter rows, shared by the LoRA settings page (what a run trains with) and the
//! Evaluate page's preference task (how pairs are scored): beta with what it means for DPO and for ORPO, DPO's loss
//! (sigmoid / IPO) and its label smoothing (sigmoid only); rows that do not apply to the method are not shown.
//! Settings a method refuses are left for the engine's `PreferenceSettings::validate` to name.

use super::setting_rows::row_ui;
use crate::engine::train::{Method, PreferenceLoss, PreferenceSettings};
use egui::{DragValue, RichText, Ui};

const BETA_DPO_HELP: &str = "DPO's beta: how far the adapter may move from the base model. The reward of an answer \
     is beta × (its log-probability with the adapter − without); a small beta (0.1, TRL's default) lets the model \
     drift further from the base, a large one keeps it close.";
const BETA_ORPO_HELP: &str = "ORPO's beta (the paper's lambda): the weight of the odds-ratio term beside the chosen \
     answer's NLL. 0.1 is TRL's default; larger values push harder on preferring chosen over rejected.";
const LOSS_HELP: &str = "sigmoid: DPO's loss, −log σ(beta × reward margin). ipo: IPO's squared loss on the margin \
     per token, which does not keep pushing pairs it already ranks right.";
const SMOOTHING_HELP: &str = "Conservative DPO: the share of pairs whose labels may be flipped (0 trusts every pair; \
     must stay below 0.5). Sigmoid loss only.";

/// Grid rows (two columns) for `method`'s parameters; nothing for SFT.
pub fn preference_rows_ui(ui: &mut Ui, method: Method, s: &mut PreferenceSettings) {
    if !method.is_preference() {
        return;
    }
    let help = if method == Method::Dpo { BETA_DPO_HELP } else { BETA_ORPO_HELP };
    row_ui(ui, "Beta", help, |ui| {
        ui.add(DragValue::new(&mut s.beta).range(0.0..=1000.0).speed(0.005).max_decimals(4));
        let meaning = match method {
            Method::Dpo => "reward scale: small drifts further from the base",
            _ => "weight of the odds-ratio term",
        };
        ui.label(RichText::new(meaning).weak());
    });
    if method != Method::Dpo {
        return;
    }
    row_ui(ui, "Loss", LOSS_HELP, |ui| {
        for loss in PreferenceLoss::ALL {
            if ui.radio(s.loss == loss, loss.name()).clicked() {
                s.loss = loss;
                if loss != PreferenceLoss::Sigmoid {
                    // Label smoothing is the sigmoid loss's alone.
                    s.label_smoothing = 0.0;
                }
            }
        }
    });
    row_ui(ui, "Label smoothing", SMOOTHING_HELP, |ui| {
        let sigmoid = s.loss == PreferenceLoss::Sigmoid;
        ui.add_enabled(sigmoid, DragValue::new(&mut s.label_smoothing).range(0.0..=0.5).speed(0.005).max_decimals(3))
            .on_disabled_hover_text("Label smoothing applies to the sigmoid loss only");
        if !sigmoid {
            ui.label(RichText::new("sigmoid only").weak());
        }
    });
}

/// `method`'s settings as ORPO or SFT accept them when switching to it: ORPO has no DPO loss (and so no label
/// smoothing), and no control would show them.
pub fn settings_for(method: Method, s: PreferenceSettings) -> PreferenceSettings {
    match method {
        Method::Orpo => PreferenceSettings { loss: PreferenceLoss::Sigmoid, label_smoothing: 0.0, ..s },
        _ => s,
    }
}

/// The engine's refusal of these settings for `method`, in its words, or None.
pub fn settings_error(method: Method, s: &PreferenceSettings) -> Option<String> {
    s.validate(method).err().map(|e| e.to_string())
}
