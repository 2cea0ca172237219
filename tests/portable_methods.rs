//! Every way of training on the portable graph (`--kernels portable`, what a Mac runs) against the fast path:
//! DoRA, gradient checkpointing, DPO, ORPO and GRPO, each a `metal-candle train` run in f32 with the native kernels
//! and with the portable ones, on three block shapes (llama; gemma3's sandwich norms, GeGLU and sliding window;
//! phi3's fused projections and partial rotary). The losses must agree step by step to 1e-5: the two graphs compute
//! the same math with different kernels, so only rounding differs. GRPO samples its completions with seeded draws
//! from the policy, which agree between the two graphs; its on-policy loss is ~0 by construction, so its gradient
//! norms and rewards are compared as well (two regex rewards that vary across the tiny model's completions; beta 0:
//! see the note in `grpo_trains_the_same_on_the_portable_graph`).
//!
//! `tests/op_coverage.rs` proves the same runs use only ops Candle's Metal backend has, in f32, bf16 and f16;
//! `tests/qlora_portable.rs` covers the quantized base.

mod common;

use common::cli::{step_events, step_losses};

const ARCHS: [&str; 3] = ["tiny-llama", "tiny-gemma3", "tiny-phi3"];

fn same_losses(what: &str, data: &str, iters: usize, extra: &[&str]) {
    for arch in ARCHS {
        let native = step_losses("native", arch, "f32", data, iters, extra);
        let portable = step_losses("portable", arch, "f32", data, iters, extra);
        assert!(native.iter().all(|l| l.is_finite()), "{what} {arch}: {native:?}");
        for (step, (a, b)) in native.iter().zip(&portable).enumerate() {
            assert!((a - b).abs() < 1e-5, "{what} {arch} step {}: native {a} vs portable {b}", step + 1);
        }
    }
}

#[test]
fn dora_trains_the_same_on_the_portable_graph() {
    same_losses("DoRA", "assets/sample-chat", 8, &["--dora", "--dropout", "0.1"]);
}

#[test]
fn checkpointing_trains_the_same_on_the_portable_graph() {
    same_losses("checkpointing", "assets/sample-chat", 8, &["--checkpointing", "on", "--dropout", "0.1"]);
}

#[test]
fn dpo_and_orpo_train_the_same_on_the_portable_graph() {
    same_losses("DPO", "assets/sample-preference", 6, &["--method", "dpo"]);
    same_losses("ORPO", "assets/sample-preference", 6, &["--method", "orpo"]);
}

/// beta 0: with a KL term, a group whose rewards are all equal leaves only the KL gradient, exactly 0 at the first
/// step in the portable graph and ~1e-8 of rounding in the native one (its policy and reference passes take
/// different kernels), which AdamW scales up to a full step; the runs then part ways without either being wrong.
#[test]
fn grpo_trains_the_same_on_the_portable_graph() {
    let grpo = ["--method", "grpo", "--num-generations", "4", "--max-new-tokens", "6"];
    let rewards = ["--reward", "regex=[aeiou]", "--reward", "regex=[0-9]"];
    let args = [&grpo[..], &rewards[..]].concat();
    for arch in ARCHS {
        let native = step_events("native", arch, "f32", "assets/sample-grpo", 5, &args);
        let portable = step_events("portable", arch, "f32", "assets/sample-grpo", 5, &args);
        for (step, (a, b)) in native.iter().zip(&portable).enumerate() {
            for (name, x, y) in [
                ("loss", &a["loss"], &b["loss"]),
                ("grad_norm", &a["grad_norm"], &b["grad_norm"]),
                ("reward_mean", &a["grpo"]["reward_mean"], &b["grpo"]["reward_mean"]),
            ] {
                let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
                assert!(
                    (x - y).abs() <= 1e-5 * (1.0 + x.abs()),
                    "GRPO {arch} step {} {name}: native {x} vs portable {y}",
                    step + 1
                );
            }
        }
        assert!(native.iter().any(|e| e["grad_norm"].as_f64().unwrap() > 0.1), "GRPO {arch}: no step learned");
    }
}
