//! The host memory `--checkpointing offload` pins, said before a run starts: each trained layer's input and, while
//! they fit the host's pinning budget, the attention results beside them (the rule the pass applies at its first
//! layer: `ops::Offloader::parks_attention`, [`attention_fits_in_host`]).

use super::ModelShape;
use crate::engine::lora::adapted_layers;
use crate::engine::ops::{attention_fits_in_host, host_pin_budget};
use crate::engine::train::{Checkpointing, TrainConfig};

/// What an offloading pass of `config` parks per trained layer in host memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffloadedLayers {
    pub layers: u64,
    /// The layer's input, (tokens x hidden).
    pub input_bytes: u64,
    /// The attention output (tokens x heads x head_dim) and one f32 logsumexp per head and token.
    pub attention_bytes: u64,
}

impl OffloadedLayers {
    pub fn of(model: &ModelShape, config: &TrainConfig) -> Self {
        let bytes = model.dtype_bytes.max(1) as u64;
        let completion = if config.method.is_reinforcement() { config.grpo.max_new_tokens as u64 } else { 0 };
        let tokens = config.rows_per_batch().max(1) as u64 * (config.seq_len.max(1) as u64 + completion);
        let heads = model.attention_heads as u64;
        Self {
            layers: adapted_layers(model.layers, config.lora.layers).len() as u64,
            input_bytes: tokens * model.hidden_size as u64 * bytes,
            attention_bytes: tokens * (heads * model.head_dim as u64 * bytes + heads * 4),
        }
    }

    /// Whether the attention results go beside the inputs within `budget_bytes` (the pass's own rule).
    pub fn parks_attention(&self, budget_bytes: Option<u64>) -> bool {
        attention_fits_in_host(self.input_bytes, self.attention_bytes, self.layers, budget_bytes)
    }
}

/// What an offloading run will keep in host memory, for the CLI's notes and the studio's log; None where the run
/// does not offload (another setting, or a device whose memory is the host's).
pub fn offload_host_note(model: &ModelShape, config: &TrainConfig) -> Option<String> {
    if config.checkpointing != Checkpointing::Offload || !model.offloads_checkpoints {
        return None;
    }
    let parked = OffloadedLayers::of(model, config);
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let inputs = gib(parked.layers * parked.input_bytes);
    let both = gib(parked.layers * (parked.input_bytes + parked.attention_bytes));
    let budget = host_pin_budget();
    Some(match budget {
        Some(b) if !parked.parks_attention(budget) => format!(
            "offload: the layer inputs and attention results would need {both:.1} GiB of host memory, more than the \
             {:.1} GiB it may pin (METAL_CANDLE_OFFLOAD_HOST_GIB sets it): the inputs only, {inputs:.1} GiB, and the \
             backward attends again",
            gib(b)
        ),
        Some(b) => format!(
            "offload: {both:.1} GiB of host memory for the layer inputs and attention results (it may pin {:.1} GiB)",
            gib(b)
        ),
        None => format!("offload: {both:.1} GiB of host memory for the layer inputs and attention results"),
    })
}
