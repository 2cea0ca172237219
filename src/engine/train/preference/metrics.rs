//! The numbers a preference run reports, under TRL's names (`rewards/chosen`, `logps/rejected`, ...), so a
//! metrics.jsonl line reads like TRL's logs and the two can be compared key by key.

/// Means over the pairs of a batch (or of several batches, weighted by their pairs).
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct PreferenceMetrics {
    /// The method's loss (DPO: sigmoid/IPO of the reward margin; ORPO: NLL plus the odds-ratio term).
    pub loss: f64,
    /// DPO: `beta * (log pi(chosen) - log ref(chosen))`; ORPO: `beta * mean log pi(chosen)` per token.
    #[serde(rename = "rewards/chosen")]
    pub rewards_chosen: f64,
    #[serde(rename = "rewards/rejected")]
    pub rewards_rejected: f64,
    /// The share of pairs whose chosen reward is strictly above the rejected one.
    #[serde(rename = "rewards/accuracies")]
    pub rewards_accuracies: f64,
    #[serde(rename = "rewards/margins")]
    pub rewards_margins: f64,
    /// DPO: summed log-probability of the chosen completion; ORPO: averaged per token.
    #[serde(rename = "logps/chosen")]
    pub logps_chosen: f64,
    #[serde(rename = "logps/rejected")]
    pub logps_rejected: f64,
    /// ORPO: the mean NLL of the chosen sequences' tokens (prompt included, as TRL counts it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nll_loss: Option<f64>,
    /// ORPO: mean `log sigmoid(log odds(chosen) - log odds(rejected))`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_odds_ratio: Option<f64>,
    /// ORPO: mean log odds ratio itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_odds_chosen: Option<f64>,
    /// How many pairs these means are over.
    pub pairs: usize,
    /// The chosen completions' summed NLL and token count (their perplexity; not a TRL metric, not saved).
    #[serde(skip)]
    pub chosen_nll: (f64, usize),
    /// ORPO: the tokens `nll_loss` is a mean over (so batches pool it by tokens, as one batch of all would).
    #[serde(skip)]
    pub nll_tokens: usize,
}

impl PreferenceMetrics {
    /// The pair-weighted mean of several batches' metrics (None for none).
    pub fn combine(parts: &[PreferenceMetrics]) -> Option<PreferenceMetrics> {
        let pairs: usize = parts.iter().map(|p| p.pairs).sum();
        if pairs == 0 {
            return None;
        }
        let mean = |f: &dyn Fn(&PreferenceMetrics) -> f64| {
            parts.iter().map(|p| f(p) * p.pairs as f64).sum::<f64>() / pairs as f64
        };
        let mean_opt = |f: &dyn Fn(&PreferenceMetrics) -> Option<f64>| {
            parts.iter().all(|p| f(p).is_some()).then(|| mean(&|p| f(p).unwrap_or(0.0)))
        };
        // ORPO's NLL is a mean over the chosen sequences' tokens: batches pool it by tokens; the rest of its loss
        // (the odds-ratio term) is a mean over pairs.
        let nll_tokens: usize = parts.iter().map(|p| p.nll_tokens).sum();
        let pooled_nll = mean_opt(&|p| p.nll_loss).map(|_| {
            parts.iter().map(|p| p.nll_loss.unwrap_or(0.0) * p.nll_tokens as f64).sum::<f64>()
                / nll_tokens.max(1) as f64
        });
        let loss = match pooled_nll {
            Some(nll) => nll + mean(&|p| p.loss - p.nll_loss.unwrap_or(0.0)),
            None => mean(&|p| p.loss),
        };
        Some(PreferenceMetrics {
            loss,
            rewards_chosen: mean(&|p| p.rewards_chosen),
            rewards_rejected: mean(&|p| p.rewards_rejected),
            rewards_accuracies: mean(&|p| p.rewards_accuracies),
            rewards_margins: mean(&|p| p.rewards_margins),
            logps_chosen: mean(&|p| p.logps_chosen),
            logps_rejected: mean(&|p| p.logps_rejected),
            nll_loss: pooled_nll,
            log_odds_ratio: mean_opt(&|p| p.log_odds_ratio),
            log_odds_chosen: mean_opt(&|p| p.log_odds_chosen),
            pairs,
            chosen_nll: parts.iter().fold((0.0, 0), |(s, n), p| (s + p.chosen_nll.0, n + p.chosen_nll.1)),
            nll_tokens,
        })
    }

    /// The perplexity of the chosen completions.
    pub fn chosen_perplexity(&self) -> f64 {
        (self.chosen_nll.0 / self.chosen_nll.1.max(1) as f64).exp()
    }

    /// Every number with its TRL name, in the order TRL logs them (for tables and plots).
    pub fn named(&self) -> Vec<(&'static str, f64)> {
        let mut out = vec![
            ("loss", self.loss),
            ("rewards/chosen", self.rewards_chosen),
            ("rewards/rejected", self.rewards_rejected),
            ("rewards/accuracies", self.rewards_accuracies),
            ("rewards/margins", self.rewards_margins),
            ("logps/chosen", self.logps_chosen),
            ("logps/rejected", self.logps_rejected),
        ];
        let extra = [
            ("nll_loss", self.nll_loss),
            ("log_odds_ratio", self.log_odds_ratio),
            ("log_odds_chosen", self.log_odds_chosen),
        ];
        out.extend(extra.into_iter().filter_map(|(name, v)| v.map(|v| (name, v))));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combining_weights_by_pairs_and_serialises_under_trl_names() {
        let a = PreferenceMetrics { loss: 1.0, rewards_accuracies: 1.0, pairs: 1, ..Default::default() };
        let b = PreferenceMetrics { loss: 4.0, rewards_accuracies: 0.0, pairs: 3, ..Default::default() };
        let c = PreferenceMetrics::combine(&[a, b]).unwrap();
        assert_eq!((c.loss, c.rewards_accuracies, c.pairs), (3.25, 0.25, 4));
        assert!(PreferenceMetrics::combine(&[]).is_none());
        let json = serde_json::to_value(c).unwrap();
        assert!(json.get("rewards/accuracies").is_some() && json.get("nll_loss").is_none());
        let back: PreferenceMetrics = serde_json::from_value(json).unwrap();
        assert_eq!(back, PreferenceMetrics { chosen_nll: (0.0, 0), ..c });
        // ORPO's NLL pools over tokens, its odds-ratio term over pairs.
        let orpo = |nll: f64, tokens, pairs| PreferenceMetrics {
            loss: nll + 0.5,
            nll_loss: Some(nll),
            nll_tokens: tokens,
            pairs,
            ..Default::default()
        };
        let c = PreferenceMetrics::combine(&[orpo(2.0, 30, 1), orpo(4.0, 10, 3)]).unwrap();
        assert_eq!((c.nll_loss, c.loss), (Some(2.5), 3.0));
    }
}
