//! Back-of-the-envelope numbers the settings update live: trainable parameters of an adapter, and the memory a
//! training run will need (base weights, adapter state, activations kept for the backward pass, logits).
//! Estimates, not measurements: they say what grows with which setting.

use crate::engine::train::{LoraSettings, TrainConfig};
use crate::worker::ModelSummary;

/// How many decoder layers carry adapters.
pub fn adapted_layers(model: &ModelSummary, lora: &LoraSettings) -> usize {
    lora.layers.map(|n| n.min(model.layers)).unwrap_or(model.layers)
}

/// LoRA parameters: `r * (in + out)` per adapted linear.
pub fn trainable_params(model: &ModelSummary, lora: &LoraSettings) -> usize {
    let Ok(targets) = lora.resolved_targets() else { return 0 };
    let per_layer: usize = model
        .linear_shapes
        .iter()
        .filter(|(name, _, _)| targets.iter().any(|t| t == name))
        .map(|(_, i, o)| lora.rank * (i + o))
        .sum();
    per_layer * adapted_layers(model, lora)
}

/// Memory for training, by part.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoryEstimate {
    pub base_weights_bytes: u64,
    /// Adapter weights, their gradients and AdamW's two moments, all f32.
    pub adapter_state_bytes: u64,
    /// Activations kept for the backward pass.
    pub activations_bytes: u64,
    /// Logits, their log-softmax and gradient (f32) for one micro-batch.
    pub logits_bytes: u64,
}

impl MemoryEstimate {
    pub fn total_bytes(&self) -> u64 {
        let sum = self.base_weights_bytes + self.adapter_state_bytes + self.activations_bytes + self.logits_bytes;
        // Allocator slack and temporaries.
        sum + sum / 10
    }
}

/// The estimate for training `model` with `config` (one micro-batch of `batch_size` x `seq_len` in flight).
pub fn training_memory(model: &ModelSummary, config: &TrainConfig) -> MemoryEstimate {
    let bytes = model.dtype_bytes.max(1) as u64;
    let tokens = (config.batch_size.max(1) * config.seq_len.max(1)) as u64;
    let h = model.hidden_size as u64;
    let i = model.intermediate_size as u64;
    let heads = model.attention_heads as u64;
    let kv = (model.kv_heads * model.head_dim) as u64;
    let seq = config.seq_len.max(1) as u64;
    // Per token and layer: norm inputs and residuals (4h), q/k/v (h + 2kv), attention output (h),
    // MLP gate/up/activation/product (4i); plus attention probabilities (heads * seq) and LoRA's x·A.
    let per_token_layer = 6 * h + 2 * kv + 4 * i + heads * seq + 2 * config.lora.rank as u64 * 7;
    let layers = model.layers as u64;
    MemoryEstimate {
        base_weights_bytes: model.parameters as u64 * bytes,
        adapter_state_bytes: trainable_params(model, &config.lora) as u64 * 16,
        activations_bytes: tokens * per_token_layer * layers * bytes,
        logits_bytes: tokens * model.vocab_size as u64 * 4 * 3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn smollm_like() -> ModelSummary {
        ModelSummary {
            path: "m.gguf".into(),
            format: "gguf".into(),
            architecture: "llama".into(),
            parameters: 134_515_008,
            layers: 30,
            hidden_size: 576,
            intermediate_size: 1536,
            attention_heads: 9,
            kv_heads: 3,
            head_dim: 64,
            vocab_size: 49152,
            context_length: 8192,
            tied_embeddings: true,
            dtype: "f32".into(),
            dtype_reason: "default on cpu".into(),
            device_note: None,
            dtype_bytes: 4,
            weights_dtype: None,
            device: "cpu".into(),
            has_chat_template: true,
            eos_token_ids: vec![2],
            linear_shapes: vec![
                ("q_proj".into(), 576, 576),
                ("k_proj".into(), 576, 192),
                ("v_proj".into(), 576, 192),
                ("o_proj".into(), 576, 576),
                ("gate_proj".into(), 576, 1536),
                ("up_proj".into(), 576, 1536),
                ("down_proj".into(), 1536, 576),
            ],
            load_secs: 0.0,
        }
    }

    #[test]
    fn trainable_params_follow_rank_targets_and_layers() {
        let m = smollm_like();
        let lora = LoraSettings { rank: 8, targets: vec!["q_proj".into(), "v_proj".into()], ..Default::default() };
        // q: 8*(576+576) + v: 8*(576+192), 30 layers
        assert_eq!(trainable_params(&m, &lora), 30 * (8 * 1152 + 8 * 768));
        let last4 = LoraSettings { layers: Some(4), ..lora.clone() };
        assert_eq!(trainable_params(&m, &last4), 4 * (8 * 1152 + 8 * 768));
        let bad = LoraSettings { targets: vec!["nope".into()], ..lora };
        assert_eq!(trainable_params(&m, &bad), 0);
    }

    #[test]
    fn memory_grows_with_batch_and_sequence() {
        let m = smollm_like();
        let small = TrainConfig { batch_size: 1, seq_len: 128, ..Default::default() };
        let big = TrainConfig { batch_size: 4, seq_len: 512, ..Default::default() };
        let (a, b) = (training_memory(&m, &small), training_memory(&m, &big));
        assert_eq!(a.base_weights_bytes, b.base_weights_bytes);
        assert!(b.activations_bytes > 4 * a.activations_bytes);
        assert!(b.total_bytes() > a.total_bytes());
    }
}
