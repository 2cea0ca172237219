//! GRPO's loss against TRL 1.16's GRPOTrainer (tests/fixtures/grpo, made by scripts/make_grpo_fixtures.py): for
//! fixed prompts, completions (some ending in eos, some cut at the length limit), rewards of two weighted reward
//! functions and old log-probabilities, on tiny-llama with a PEFT adapter whose B is not zero, our advantages,
//! per-token log-probabilities (temperature 0.7, policy and reference), loss, KL, clip ratios, reward and
//! completion metrics and every LoRA gradient equal TRL's (1e-4), for each loss type, with and without the KL
//! term, off-policy (clipped low and high, with and without `epsilon_high`), each reward scaling and two
//! micro-batches of gradient accumulation.

mod common;

use candle_core::{DType, Device};
use common::*;
use metal_candle::engine::checkpoint;
use metal_candle::engine::lora::AdapterParam;
use metal_candle::engine::model::transformer::Transformer;
use metal_candle::engine::model::{load_model, LoadedModel};
use metal_candle::engine::train::backprop::Pass;
use metal_candle::engine::train::grpo::batch::{Completion, Rollout};
use metal_candle::engine::train::grpo::objective::advantages;
use metal_candle::engine::train::grpo::round::step_metrics;
use metal_candle::engine::train::grpo::step::GrpoObjective;
use metal_candle::engine::train::grpo::GrpoSettings;
use serde_json::Value;
use std::path::PathBuf;

fn dir() -> PathBuf {
    fixture("grpo")
}

fn expected() -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir().join("expected.json")).unwrap()).unwrap()
}

/// 1e-4 relative to TRL's value, absolute below 1e-2 (near-zero losses, advantages of flat groups).
fn close(ours: f64, theirs: f64, what: &str) {
    let tolerance = 1e-4 * theirs.abs().max(1e-2);
    assert!((ours - theirs).abs() <= tolerance, "{what}: ours {ours} vs TRL {theirs}");
}

fn close_rows(ours: &[Vec<f64>], theirs: &Value, what: &str) {
    let theirs = theirs.as_array().unwrap();
    assert_eq!(ours.len(), theirs.len(), "{what}: completions");
    for (c, (o, t)) in ours.iter().zip(theirs).enumerate() {
        let t = floats(t);
        assert_eq!(o.len(), t.len(), "{what}: completion {c} tokens");
        for (k, (a, b)) in o.iter().zip(&t).enumerate() {
            close(*a, *b, &format!("{what}: completion {c} token {k}"));
        }
    }
}

fn logps(v: Option<&Value>) -> Option<Vec<Vec<f64>>> {
    v.map(|rows| rows.as_array().unwrap().iter().map(floats).collect())
}

/// Our settings for a case, from the GRPOConfig values TRL ran with.
fn settings(config: &Value) -> GrpoSettings {
    let f = |k: &str| config[k].as_f64().unwrap();
    let u = |k: &str| config[k].as_u64().unwrap() as usize;
    GrpoSettings {
        num_generations: u("num_generations"),
        max_new_tokens: u("max_completion_length"),
        temperature: f("temperature"),
        num_iterations: u("num_iterations"),
        beta: f("beta"),
        epsilon: f("epsilon"),
        epsilon_high: config["epsilon_high"].as_f64(),
        loss: config["loss_type"].as_str().unwrap().parse().unwrap(),
        scale_rewards: config["scale_rewards"].as_str().unwrap().parse().unwrap(),
        ..Default::default()
    }
}

/// The fixture's completions as a rollout (no advantages or log-probabilities yet).
fn rollout(exp: &Value, per_micro: usize) -> Rollout {
    let group = exp["group"].as_u64().unwrap() as usize;
    let prompts = exp["prompt_ids"].as_array().unwrap();
    let finished = exp["finished"].as_array().unwrap();
    let completions: Vec<Completion> = exp["completion_ids"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, c)| Completion {
            prompt: i / group,
            prompt_ids: ids(&prompts[i]),
            ids: ids(c),
            finished: finished[i].as_bool().unwrap(),
            text: String::new(),
        })
        .collect();
    let names: Vec<&str> = exp["reward_names"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    let rewards: Vec<Vec<f64>> = (0..completions.len())
        .map(|i| names.iter().map(|n| exp["rewards"][n][i].as_f64().unwrap()).collect())
        .collect();
    let weights = floats(&exp["reward_weights"]);
    let reward_totals: Vec<f64> = rewards.iter().map(|r| r.iter().zip(&weights).map(|(v, w)| v * w).sum()).collect();
    for (ours, theirs) in reward_totals.iter().zip(floats(&exp["reward_totals"])) {
        assert!((ours - theirs).abs() < 1e-12, "weighted totals {ours} vs {theirs}");
    }
    // TRL's micro-batches: runs of per_device_train_batch_size completions.
    let micro_sizes = (0..completions.len()).step_by(per_micro).map(|s| per_micro.min(completions.len() - s)).collect();
    Rollout {
        group,
        micro_sizes,
        completions,
        rewards,
        reward_totals,
        advantages: vec![],
        zero_std_groups: 0.0,
        old_logps: None,
        ref_logps: None,
        generation_secs: 0.0,
        reward_secs: 0.0,
    }
}

fn policy(base: &LoadedModel, exp: &Value) -> (Transformer, Vec<AdapterParam>) {
    let mut model = base.model.clone();
    let adapter = dir().join(exp["adapter"].as_str().unwrap());
    let (_, params) = checkpoint::load_adapter_params(&mut model, &adapter).unwrap();
    (model, params)
}

#[test]
fn every_case_matches_trls_grpo_loss() {
    let exp = expected();
    let base = load_model(&fixture("tiny-llama"), &Device::Cpu, DType::F32).unwrap();
    let (model, params) = policy(&base, &exp);
    let grads = candle_core::safetensors::load(dir().join("grads.safetensors"), &Device::Cpu).unwrap();
    let pad_id = exp["pad_token_id"].as_u64().unwrap() as u32;
    let names: Vec<String> =
        exp["reward_names"].as_array().unwrap().iter().map(|n| n.as_str().unwrap().to_string()).collect();
    let cases = exp["cases"].as_object().unwrap();
    assert!(cases.len() >= 16, "the fixture holds {} cases", cases.len());
    let mut compared_grads = 0;
    for (name, case) in cases {
        let config = &case["config"];
        let s = settings(config);
        let per_micro = config["per_device_train_batch_size"].as_u64().unwrap() as usize;
        let mut r = rollout(&exp, per_micro);

        // Advantages from the weighted totals, with the case's scaling.
        let adv = advantages(&r.reward_totals, s.num_generations, s.scale_rewards);
        for (i, (a, t)) in adv.values.iter().zip(floats(&case["advantages"])).enumerate() {
            close(*a, t, &format!("{name}: advantage {i}"));
        }
        r.advantages = adv.values;
        r.zero_std_groups = adv.zero_std_groups;

        // The policy's per-token log-probabilities at the sampling temperature, and the reference's.
        let objective = GrpoObjective::new(s.clone(), &base.model, pad_id);
        let current = objective.token_logps(&model, &r).unwrap();
        close_rows(&current, &case["logps"], &format!("{name}: policy logps"));
        r.ref_logps = objective.reference_logps(&r).unwrap();
        match (&r.ref_logps, case.get("ref_logps")) {
            (Some(ours), Some(theirs)) => close_rows(ours, theirs, &format!("{name}: reference logps")),
            (None, None) => {}
            (ours, theirs) => panic!("{name}: reference logps ours {} vs TRL {}", ours.is_some(), theirs.is_some()),
        }
        // The old log-probabilities are TRL's (perturbed off the current ones, so that ratios clip).
        r.old_logps = logps(case.get("old_logps"));
        assert_eq!(r.old_logps.is_some(), s.num_iterations > 1, "{name}");

        let pass = Pass::default();
        let (step, ours) = objective.loss_and_gradients(&model, &r, pass).unwrap();
        close(step.loss, case["loss"].as_f64().unwrap(), &format!("{name}: loss"));

        // Metrics, under TRL's names. TRL logs the mean of the micro-batches' token means; we report the step's
        // token mean, which the fixture also holds for the accumulation cases.
        let metrics = serde_json::to_value(step_metrics(&r, &names, &step, true, 0.0)).unwrap();
        let theirs = &case["metrics"];
        let weighted = case.get("token_weighted");
        let mut compared = 0;
        for (key, value) in metrics.as_object().unwrap() {
            if key.starts_with("time/") {
                continue;
            }
            let trl_key = match key.as_str() {
                "reward_mean" => "reward",
                k => k,
            };
            let want = weighted
                .and_then(|w| w.get(trl_key))
                .or_else(|| theirs.get(trl_key))
                .unwrap_or_else(|| panic!("{name}: TRL logs no `{trl_key}`"));
            close(value.as_f64().unwrap(), want.as_f64().unwrap(), &format!("{name}: {key}"));
            compared += 1;
        }
        assert_eq!(metrics.get("kl").is_some(), theirs.get("kl").is_some(), "{name}: kl reported iff beta > 0");
        assert!(compared >= 14, "{name}: only {compared} metrics compared");

        // Every LoRA gradient (ours are stored transposed from PEFT's: A (in, r), B (r, out)).
        let mut count = 0;
        for p in &params {
            let prefix = checkpoint::peft_prefix(p.layer, p.module);
            for (var, side) in [(&p.a, "lora_A"), (&p.b, "lora_B")] {
                let key = format!("{name}/{prefix}.{side}.weight");
                let want = grads.get(&key).unwrap_or_else(|| panic!("TRL has no {key}"));
                let got = ours.get(var.as_tensor()).unwrap_or_else(|| panic!("no gradient for {key}"));
                let got: Vec<f32> = got.t().unwrap().flatten_all().unwrap().to_vec1().unwrap();
                let want: Vec<f32> = want.flatten_all().unwrap().to_vec1().unwrap();
                let scale = want.iter().map(|v| v.abs()).fold(0f32, f32::max);
                assert!(scale > 1e-6, "{key}: TRL's gradient is zero");
                let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                assert!(worst / scale < 1e-4, "{key}: max diff {worst} of {scale}");
                count += 1;
            }
        }
        let theirs_count = grads.keys().filter(|k| k.starts_with(&format!("{name}/"))).count();
        assert_eq!(count, theirs_count, "{name}: every TRL gradient has ours");
        compared_grads += count;
    }
    assert_eq!(compared_grads, grads.len());
}

/// The cases test what they claim: clipping happens on both sides off-policy, `epsilon_high` changes which
/// tokens clip, a group's flat rewards give zero advantages, and the loss types normalise differently.
#[test]
fn the_fixture_exercises_what_it_claims() {
    let exp = expected();
    let c = &exp["cases"];
    let m = |case: &str, k: &str| c[case]["metrics"][k].as_f64().unwrap();
    for loss in ["grpo", "bnpo", "dr_grpo", "dapo"] {
        let off = format!("{loss}_offpolicy");
        assert!(m(&off, "clip_ratio/low_mean") > 0.0 && m(&off, "clip_ratio/high_mean") > 0.0, "{off}");
        assert!(m(&off, "kl") > 0.0, "{off}");
        assert!(c[loss]["metrics"].get("kl").is_none());
    }
    assert!(m("dapo_offpolicy_eps_high", "clip_ratio/high_mean") < m("dapo_offpolicy", "clip_ratio/high_mean"));
    assert_eq!(m("grpo", "frac_reward_zero_std"), 0.5);
    assert_eq!(floats(&c["grpo"]["advantages"])[4..], [0.0; 4]);
    assert!(m("grpo", "completions/clipped_ratio") > 0.0 && m("grpo", "completions/min_length") == 1.0);
    let losses: Vec<f64> = ["grpo_offpolicy", "bnpo_offpolicy", "dr_grpo_offpolicy"]
        .iter()
        .map(|k| c[k]["loss"].as_f64().unwrap())
        .collect();
    assert!(losses[0] != losses[1] && losses[1] != losses[2], "{losses:?}");
    assert_eq!(c["dapo_accum2"]["micro_losses"].as_array().unwrap().len(), 2);
    // TRL 1.16's default KL (weighed by the ratio), which our objective follows.
    for (name, case) in c.as_object().unwrap() {
        assert_eq!(case["config"]["use_bias_correction_kl"], true, "{name}");
    }
}
