//! TEMPORARY compile stub (replaced by the wt-rewards branch).
use crate::engine::data::PromptRow;
use crate::engine::train::grpo::settings::{reward_names, RewardSpec};
use crate::engine::Result;
pub struct RewardInput<'a> {
    pub row: &'a PromptRow,
    pub completion: &'a str,
    pub completion_tokens: usize,
    pub location: &'a str,
}
pub struct Rewards {
    names: Vec<String>,
    weights: Vec<f64>,
}
pub struct RewardTable {
    pub values: Vec<Vec<f64>>,
    pub total: Vec<f64>,
}
impl Rewards {
    pub fn new(specs: &[RewardSpec]) -> Result<Self> {
        Ok(Self { names: reward_names(specs), weights: specs.iter().map(|s| s.weight).collect() })
    }
    pub fn names(&self) -> &[String] {
        &self.names
    }
    pub fn weights(&self) -> Vec<f64> {
        self.weights.clone()
    }
    pub fn check_rows(&self, _rows: &[PromptRow], _location: &dyn Fn(usize) -> String) -> Result<()> {
        Ok(())
    }
    pub fn preflight(&self, _row: &PromptRow, _location: &str) -> Result<()> {
        Ok(())
    }
    pub fn score(&self, inputs: &[RewardInput], _c: &dyn Fn() -> bool) -> Result<RewardTable> {
        let values: Vec<Vec<f64>> = inputs
            .iter()
            .map(|i| vec![if Some(i.completion.trim()) == i.row.answer.as_deref() { 1.0 } else { 0.0 }])
            .collect();
        let total = values.iter().map(|v| v[0]).collect();
        Ok(RewardTable { values, total })
    }
}
