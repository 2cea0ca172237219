//! The one rule of which data a method trains on: SFT learns supervised rows (chat, completions, text, ...),
//! DPO and ORPO compare preference pairs, GRPO samples answers to prompts. The trainer checks the prepared data
//! with it before a run starts ([`require_rows_fit`]), the studio checks its dataset report with it
//! ([`check_method_fits_rows`]), so both refuse a mismatch in the same words and name the method that fits
//! ([`method_for`]).

use super::method::Method;
use crate::engine::data::formats::{PREFERENCE_NOT_SFT, PROMPTS_NOT_SUPERVISED};
use crate::engine::data::{DatasetFormat, PreparedDataset, RowKind};
use crate::engine::{Error, Result};
use std::path::Path;

/// What GRPO reads, for refusals.
const GRPO_NEEDS: &str = "GRPO needs prompts with answers: {\"prompt\", \"answer\"} rows (or {\"messages\": [...], \
     \"answer\"}, gsm8k's question/answer, MATH's problem/solution)";

/// The method that trains on rows of `kind` (SFT for supervised rows, DPO for pairs, GRPO for prompts).
pub fn method_for(kind: RowKind) -> Method {
    match kind {
        RowKind::Supervised => Method::Sft,
        RowKind::Pairs => Method::Dpo,
        RowKind::Prompts => Method::Grpo,
    }
}

/// Refuse `method` on a dataset whose training split is in `format` when it cannot train on such rows, naming
/// `path`, what the rows are and what to do.
pub fn check_method_fits_rows(method: Method, format: DatasetFormat, path: &Path) -> Result<()> {
    let kind = format.kind();
    let fits = match kind {
        RowKind::Supervised => method == Method::Sft,
        RowKind::Pairs => method.is_preference(),
        RowKind::Prompts => method.is_reinforcement(),
    };
    if fits {
        return Ok(());
    }
    let path = path.display();
    let message = match (kind, method) {
        (RowKind::Pairs, Method::Grpo) => {
            format!("{path}: this dataset holds preference pairs (`chosen`/`rejected`); {GRPO_NEEDS}, or train with --method dpo or orpo")
        }
        (RowKind::Pairs, _) => format!("{path}: {PREFERENCE_NOT_SFT}"),
        (RowKind::Prompts, _) => format!("{path}: {PROMPTS_NOT_SUPERVISED}"),
        (RowKind::Supervised, Method::Grpo) => format!(
            "{path}: this dataset holds {format} rows; {GRPO_NEEDS}; name the columns with --columns \
             prompt=...,answer=..., or train with --method sft"
        ),
        (RowKind::Supervised, _) => format!(
            "{path}: DPO and ORPO train on preference pairs, but this dataset holds {format} rows; give rows with \
             `chosen` and `rejected` (and `prompt`), name the columns with --columns chosen=...,rejected=..., or \
             train with --method sft"
        ),
    };
    Err(Error::Data(message))
}

/// [`check_method_fits_rows`] on prepared data (the trainer's check before a run starts).
pub fn require_rows_fit(method: Method, dataset: &PreparedDataset, path: &Path) -> Result<()> {
    check_method_fits_rows(method, dataset.summary.format, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_method_takes_its_rows_and_refuses_the_others() {
        let p = Path::new("d");
        let err = |m, f| check_method_fits_rows(m, f, p).unwrap_err().to_string();
        for (format, fits) in [
            (DatasetFormat::Chat, Method::Sft),
            (DatasetFormat::Text, Method::Sft),
            (DatasetFormat::Preference, Method::Dpo),
            (DatasetFormat::Prompts, Method::Grpo),
        ] {
            assert_eq!(method_for(format.kind()), fits);
            for method in Method::ALL {
                let ok = method == fits || (fits == Method::Dpo && method == Method::Orpo);
                assert_eq!(check_method_fits_rows(method, format, p).is_ok(), ok, "{method:?} on {format}");
            }
        }
        assert!(err(Method::Grpo, DatasetFormat::Chat).contains("holds chat rows; GRPO needs prompts with answers"));
        assert!(err(Method::Grpo, DatasetFormat::Preference).contains("holds preference pairs"));
        for method in [Method::Sft, Method::Dpo, Method::Orpo] {
            assert!(err(method, DatasetFormat::Prompts).contains("train with --method grpo"));
        }
        assert!(err(Method::Sft, DatasetFormat::Preference).contains(PREFERENCE_NOT_SFT));
        assert!(err(Method::Dpo, DatasetFormat::Alpaca).contains("DPO and ORPO train on preference pairs"));
    }
}
