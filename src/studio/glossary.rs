//! The words of the settings, in one place: what each training setting means and its typical values. The
//! settings' hover texts (LoRA settings page, model page) and the Help window's glossary both read them from
//! here, so an explanation is written once. Also how the LoRA targets read for the loaded model (a setting of
//! names that only a loaded family can resolve).

use crate::engine::estimate::ModelShape;
use crate::engine::lora::Targets;

/// One glossary entry.
pub struct Term {
    /// The setting's name as the studio labels it.
    pub name: &'static str,
    /// What it does, in a sentence or three.
    pub meaning: &'static str,
    /// Typical values and when to move them.
    pub typical: &'static str,
    /// The page (navigation title) where it is set.
    pub page: &'static str,
}

impl Term {
    /// The hover text of the setting: its meaning, then its typical values.
    pub fn hover(&self) -> String {
        format!("{} {}", self.meaning, self.typical)
    }
}

pub const RANK: Term = Term {
    name: "Rank",
    meaning: "Inner dimension r of the low-rank update B·A that LoRA adds to each adapted linear. Higher rank: \
              more capacity, more trainable parameters and memory.",
    typical: "8–16 suits most fine-tunes; use the Rank explorer to compare.",
    page: "LoRA settings",
};

pub const ALPHA: Term = Term {
    name: "Alpha",
    meaning: "Scales the update: the adapter's output is multiplied by alpha / rank (alpha / √rank with rsLoRA). \
              Raising it is like raising the adapter's learning rate.",
    typical: "Alpha ≈ 2 × rank is a common default (16 for rank 8).",
    page: "LoRA settings",
};

pub const RSLORA: Term = Term {
    name: "rsLoRA",
    meaning: "Rank-stabilized LoRA: scale by alpha/√rank instead of alpha/rank, so higher ranks keep learning at a \
              similar speed.",
    typical: "Off by default; worth trying at rank 64 and above.",
    page: "LoRA settings",
};

pub const DORA: Term = Term {
    name: "DoRA",
    meaning: "Weight-decomposed LoRA: also trains one magnitude per output row of each adapted weight, so the \
              adapter can change a weight's length apart from its direction. Saved as a PEFT DoRA adapter \
              (use_dora); a little slower per step than plain LoRA.",
    typical: "Off by default; can help at low ranks.",
    page: "LoRA settings",
};

pub const DROPOUT: Term = Term {
    name: "Dropout",
    meaning: "Dropout on the adapter's input during training: helps small datasets overfit less.",
    typical: "0 (off) to 0.1.",
    page: "LoRA settings",
};

pub const TARGETS: Term = Term {
    name: "Target modules",
    meaning: "Which linear layers of each decoder block get an adapter. Attention projections (q, k, v, o) are \
              the classic choice; adding the MLP (gate, up, down) trains more parameters and often fits better. \
              Names apply to the loaded model's own linears: where a family fuses q, k and v (or gate and up) \
              into one projection, that projection is adapted.",
    typical: "q_proj + v_proj (the LoRA paper), or all linear (QLoRA style).",
    page: "LoRA settings",
};

pub const LAYERS: Term = Term {
    name: "Layers",
    meaning: "Adapt every decoder layer, or only the last N (cheaper; the top layers matter most for style and \
              format).",
    typical: "All layers unless memory or time is tight.",
    page: "LoRA settings",
};

pub const LEARNING_RATE: Term = Term {
    name: "Learning rate",
    meaning: "Peak AdamW learning rate, reached after warmup. Too high: the loss jumps or becomes NaN; too low: \
              it barely moves.",
    typical: "LoRA tolerates higher rates than full fine-tuning: 1e-4 to 5e-4 (default 2e-4).",
    page: "LoRA settings",
};

pub const WARMUP: Term = Term {
    name: "Warmup",
    meaning: "Steps over which the learning rate rises from near zero to its peak, so the first, noisy updates \
              are small. The schedule (constant, linear or cosine) then decays it.",
    typical: "\"fit to run\": 10 steps, or a tenth of a run of 10 steps or fewer.",
    page: "LoRA settings",
};

pub const BATCH: Term = Term {
    name: "Batch size",
    meaning: "Examples per micro-batch; memory grows linearly with it. Accumulation sums several micro-batches' \
              gradients before each optimizer step: a larger effective batch without more memory.",
    typical: "Batch 4 with accumulation 1–4; raise accumulation, not the batch, when memory is short.",
    page: "LoRA settings",
};

pub const SEQUENCE_LENGTH: Term = Term {
    name: "Sequence length",
    meaning: "Maximum tokens per example; longer rows are cut (the Dataset page shows how many). Activation \
              memory grows with it.",
    typical: "The dataset's longest rows, up to the model's context: 256–2048.",
    page: "LoRA settings",
};

pub const CHECKPOINTING: Term = Term {
    name: "Checkpointing",
    meaning: "Gradient checkpointing: keep only each layer's input during the forward pass and recompute the \
              layer before its backward. Activation memory drops to about one layer's worth, for about a third \
              more compute. offload: the same, with the kept inputs in the computer's memory on an NVIDIA GPU \
              (copied while the layers compute): long contexts whose inputs alone fill the GPU. Not to be confused \
              with the saved checkpoints of a run.",
    typical: "auto turns it on when the memory estimate says the run would not fit otherwise; offload for long \
              contexts on NVIDIA (elsewhere it is the same as on).",
    page: "LoRA settings",
};

pub const BASE_WEIGHTS: Term = Term {
    name: "Base weights",
    meaning: "How the frozen base model's linear weights are held (QLoRA). none: dense in the dtype; keep: a \
              GGUF's own quantized types; q8_0 … q4_0: quantized at load, one tensor at a time. The head is then \
              held in Q6_K and untied embeddings in Q4_K (llama.cpp's Q4_K_M mix; Q8_0 with q8_0 and keep); \
              norms stay dense. Applies to the next load.",
    typical: "none while the model fits; q4k or keep (a Q4 GGUF) to train a larger model in less memory.",
    page: "Model",
};

pub const VALIDATION: Term = Term {
    name: "Validation loss",
    meaning: "The loss on rows held out from training (valid.jsonl, or a slice of train). Falling training loss \
              with rising validation loss means the adapter is memorising: stop earlier or use more data.",
    typical: "Evaluate every 20–100 steps.",
    page: "LoRA settings",
};

pub const EARLY_STOPPING: Term = Term {
    name: "Early stopping",
    meaning: "Stop the run cleanly (a final checkpoint is saved) after this many evaluations in a row whose \
              validation loss is not lower than the best so far minus the min delta: the adapter has stopped \
              getting better on held-out rows. Needs a validation split and \"Evaluate every\" above 0.",
    typical: "Off by default; 3–5 evaluations with a min delta of 0 (or 0.001–0.01 to ignore noise).",
    page: "LoRA settings",
};

pub const BEST_CHECKPOINT: Term = Term {
    name: "Best checkpoint",
    meaning: "The checkpoint whose validation loss is the lowest of the run so far (marked on the Checkpoints page, \
              best_checkpoint in run.json). Each new best is saved at once, whatever the save interval.",
    typical: "Usually the one to chat with, export or evaluate once validation loss has started to rise.",
    page: "Checkpoints",
};

pub const SAVE_LIMIT: Term = Term {
    name: "Checkpoint limit",
    meaning: "Keep only the newest N checkpoints of the run plus the best one; older ones are deleted after \
              each save. The best checkpoint is never deleted.",
    typical: "Off (keep all) by default; 2–3 when disk space is short.",
    page: "LoRA settings",
};

pub const EVALUATION: Term = Term {
    name: "Evaluation",
    meaning: "Scores the base model, checkpoints and adapters on the same rows. Loss: loss and perplexity (e^loss) \
              on a split, templated and masked as training does. Generate: each row's prompt answered and compared \
              with its reference (exact match after trimming, contains, token F1, an optional regex and judge \
              model). Multiple choice: each choice's log-likelihood as lm-evaluation-harness computes it; acc picks \
              the highest, acc_norm the highest per character.",
    typical: "Loss on the test or valid split to rank checkpoints; generate on a few dozen prompts to read answers.",
    page: "Evaluate",
};

pub const GRPO: Term = Term {
    name: "GRPO",
    meaning: "Group relative policy optimisation (DeepSeekMath; TRL's GRPOTrainer): the model samples several \
              completions of each prompt, rewards score them, and each completion is pushed up or down by how its \
              reward compares with its group's mean. It learns from its own answers, so it needs prompts and \
              rewards, not reference answers to copy.",
    typical: "For tasks with a checkable answer (maths, formats, tool calls); start from a model that already \
              solves some prompts, or every group scores the same and nothing is learned.",
    page: "LoRA settings",
};

pub const GENERATIONS: Term = Term {
    name: "Completions per prompt",
    meaning: "How many completions GRPO samples for each prompt (TRL's num_generations): the group whose mean \
              reward each completion is measured against. A step trains on batch × this many sequences.",
    typical: "8 (TRL's default); 4 on small machines, 16 for a steadier signal. At least 2.",
    page: "LoRA settings",
};

pub const KL_BETA: Term = Term {
    name: "KL beta",
    meaning: "Weight of the KL penalty that keeps the adapter close to the base model (the reference: the same \
              model with the adapter switched off). 0 skips the reference pass altogether.",
    typical: "0 (TRL's default, as in DAPO and Dr. GRPO); 0.01–0.04 when the model drifts into nonsense.",
    page: "LoRA settings",
};

pub const CLIP_EPSILON: Term = Term {
    name: "Clip epsilon",
    meaning: "PPO-style clipping of the probability ratio to [1 − low, 1 + high]: a completion cannot be pushed \
              further than that within one batch. With one iteration per batch the ratio stays 1 and nothing is \
              clipped. High on its own is DAPO's clip-higher, leaving rare tokens more room to grow.",
    typical: "low 0.2; high the same, or 0.28 (DAPO).",
    page: "LoRA settings",
};

pub const GRPO_LOSS: Term = Term {
    name: "Loss type",
    meaning: "How token losses are averaged: grpo (each completion's mean, then the mean over completions: short \
              completions weigh more), bnpo (the micro-batch's token mean), dr_grpo (a sum over completions × max \
              new tokens: no length bias), dapo (every token of the step weighs the same).",
    typical: "dapo (TRL's default).",
    page: "LoRA settings",
};

pub const REWARD_SCALING: Term = Term {
    name: "Reward scaling",
    meaning: "What a completion's advantage (its reward minus its group's mean) is divided by: the group's \
              standard deviation, the whole step's, or nothing (Dr. GRPO: no bias towards groups that barely differ).",
    typical: "group (TRL's default); none for Dr. GRPO.",
    page: "LoRA settings",
};

pub const REWARDS: Term = Term {
    name: "Rewards",
    meaning: "What scores each sampled completion; the total is their weighted sum. Exact answer: 1 when the \
              completion's answer equals the row's. Regex: 1 when a pattern matches. Format: 1 when the whole \
              completion has a structure (<think>…</think><answer>…</answer>). Length: a penalty past a token \
              budget. Program: your own scorer, run once per completion without a shell.",
    typical: "Exact answer (weight 1) plus format (0.2–0.5) for reasoning tasks.",
    page: "LoRA settings",
};

/// Every entry, in the order the Help window lists them.
pub const ALL: [&Term; 25] = [
    &RANK,
    &ALPHA,
    &RSLORA,
    &DORA,
    &DROPOUT,
    &TARGETS,
    &LAYERS,
    &LEARNING_RATE,
    &WARMUP,
    &BATCH,
    &SEQUENCE_LENGTH,
    &CHECKPOINTING,
    &BASE_WEIGHTS,
    &VALIDATION,
    &EARLY_STOPPING,
    &BEST_CHECKPOINT,
    &SAVE_LIMIT,
    &EVALUATION,
    &GRPO,
    &GENERATIONS,
    &KL_BETA,
    &CLIP_EPSILON,
    &GRPO_LOSS,
    &REWARD_SCALING,
    &REWARDS,
];

/// The LoRA targets as they will apply: with a model loaded, only the linears its family has (all-linear
/// becomes those, a separate projection the family fuses becomes the fused one); without one, the names as
/// set, which apply by name when a model loads.
pub fn targets_summary(targets: &Targets, model: Option<&ModelShape>) -> String {
    match model {
        Some(shape) => match targets.among(&shape.linear_targets(), "this model") {
            Ok(resolved) => resolved.to_string(),
            Err(_) => format!("{targets}: not all are linears of this model"),
        },
        None if *targets == Targets::all() => "all linear (the model's own, once one is loaded)".into(),
        None => format!("{targets} (applied by name when a model loads)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::lora::Target;

    fn shape_with(names: &[&str]) -> ModelShape {
        ModelShape { linear_shapes: names.iter().map(|n| (n.to_string(), 8, 8)).collect(), ..Default::default() }
    }

    #[test]
    fn all_linear_lists_only_the_loaded_familys_linears() {
        let llama = shape_with(&["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]);
        let shown = targets_summary(&Targets::all(), Some(&llama));
        assert_eq!(shown, "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj");
        let phi3 = shape_with(&["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]);
        assert_eq!(targets_summary(&Targets::all(), Some(&phi3)), "qkv_proj, o_proj, gate_up_proj, down_proj");
        let qv = Targets::of(&[Target::QProj, Target::VProj]);
        assert_eq!(targets_summary(&qv, Some(&phi3)), "qkv_proj", "a fused family adapts the fused projection");
        assert!(targets_summary(&Targets::of(&[Target::QkvProj]), Some(&llama)).contains("not all are linears"));
    }

    #[test]
    fn without_a_model_the_names_apply_when_one_loads() {
        let shown = targets_summary(&Targets::all(), None);
        assert!(!shown.contains("qkv_proj") && shown.contains("once one is loaded"), "{shown}");
        let qv = Targets::of(&[Target::QProj, Target::VProj]);
        assert_eq!(targets_summary(&qv, None), "q_proj, v_proj (applied by name when a model loads)");
    }

    #[test]
    fn every_term_has_text_and_a_page() {
        for term in ALL {
            assert!(!term.meaning.is_empty() && !term.typical.is_empty(), "{}", term.name);
            assert!(term.hover().starts_with(term.meaning), "{}", term.name);
            let page = crate::studio::prefs::Page::ALL.into_iter().find(|p| p.title() == term.page);
            assert!(page.is_some(), "{} names no page: {}", term.name, term.page);
        }
    }
}
