//! GRPO's objective through the model (tiny-llama, CPU, f32): completions sampled from the same seeds are the
//! same; the per-token log-probabilities are taken at the sampling temperature; and the adapter gradients of
//! the clipped objective with its KL term, normalised by each loss type over two micro-batches, equal finite
//! differences of the loss computed from those log-probabilities.

mod common;

use candle_core::{DType, Device, Tensor};
use common::fixture;
use metal_candle::engine::lora;
use metal_candle::engine::model::load_model;
use metal_candle::engine::train::backprop::Pass;
use metal_candle::engine::train::grpo::batch::Rollout;
use metal_candle::engine::train::grpo::objective::{advantages, token_term, token_weights, Clip};
use metal_candle::engine::train::grpo::rollout::{completion_seed, sample_group, SamplingContext};
use metal_candle::engine::train::grpo::step::GrpoObjective;
use metal_candle::engine::train::grpo::{GrpoLoss, GrpoSettings, ScaleRewards};
use metal_candle::engine::train::LoraSettings;

fn settings(loss: GrpoLoss) -> GrpoSettings {
    GrpoSettings {
        num_generations: 3,
        max_new_tokens: 5,
        temperature: 0.7,
        beta: 0.04,
        epsilon_high: Some(0.28),
        loss,
        ..Default::default()
    }
}

/// The loss of `rollout` under `model` from its token log-probabilities (what the gradients must be of).
fn host_loss(
    objective: &GrpoObjective,
    model: &metal_candle::engine::model::transformer::Transformer,
    r: &Rollout,
) -> f64 {
    let s = &objective.settings;
    let logps = objective.token_logps(model, r).unwrap();
    let weights = token_weights(s.loss, &r.micro_lengths(), s.max_new_tokens);
    let clip = Clip { epsilon_low: s.epsilon, epsilon_high: s.epsilon_high(), beta: s.beta };
    let mut loss = 0.0;
    for (m, range) in r.micro_ranges().into_iter().enumerate() {
        for c in range.clone() {
            for (t, &logp) in logps[c].iter().enumerate() {
                let old = r.old_logps.as_ref().unwrap()[c][t];
                let reference = r.ref_logps.as_ref().map(|x| x[c][t]);
                loss += weights[m][c - range.start] * token_term(logp, old, reference, r.advantages[c], clip).loss;
            }
        }
    }
    loss
}

#[test]
fn sampling_is_seeded_and_gradients_match_finite_differences() {
    let base = load_model(&fixture("tiny-llama"), &Device::Cpu, DType::F32).unwrap();
    let mut model = base.model.clone();
    let lora = LoraSettings {
        rank: 4,
        alpha: 8.0,
        targets: "all-linear".parse().unwrap(),
        dropout: 0.0,
        ..Default::default()
    };
    let params = lora::attach_new_adapters(&mut model, &lora, 7).unwrap();
    for (i, p) in params.iter().enumerate() {
        let b = Tensor::randn(0f32, 0.05, p.b.dims(), &Device::Cpu).unwrap();
        p.b.set(&b).unwrap();
        let _ = i;
    }
    let eos = base.eos_token_ids.clone();
    for loss in [GrpoLoss::Dapo, GrpoLoss::Grpo, GrpoLoss::Bnpo, GrpoLoss::DrGrpo] {
        let s = settings(loss);
        let ctx = SamplingContext { model: &model, tokenizer: &base.tokenizer, eos_token_ids: &eos, settings: &s };
        let prompts: [&[u32]; 2] = [&[1, 5, 9, 13], &[1, 7, 3]];
        let mut completions = Vec::new();
        for (p, ids) in prompts.iter().enumerate() {
            let seeds: Vec<u64> = (0..3).map(|k| completion_seed(11, 0, p * 3 + k)).collect();
            let group = sample_group(&ctx, p, ids, &seeds, &|| false).unwrap();
            assert_eq!(group, sample_group(&ctx, p, ids, &seeds, &|| false).unwrap(), "same seeds, same samples");
            completions.extend(group);
        }
        let rewards = [1.0, 0.0, 0.5, 0.2, 0.9, 0.2];
        let adv = advantages(&rewards, 3, ScaleRewards::Group);
        let objective = GrpoObjective::new(s.clone(), &base.model, 0);
        let mut rollout = Rollout {
            group: 3,
            micro_sizes: vec![3, 3],
            completions,
            rewards: rewards.iter().map(|r| vec![*r]).collect(),
            reward_totals: rewards.to_vec(),
            advantages: adv.values,
            zero_std_groups: adv.zero_std_groups,
            old_logps: None,
            ref_logps: None,
            generation_secs: 0.0,
            reward_secs: 0.0,
        };
        // Old log-probs off the current ones, so that some tokens clip on either side.
        let current = objective.token_logps(&model, &rollout).unwrap();
        let old: Vec<Vec<f64>> = current
            .iter()
            .enumerate()
            .map(|(c, row)| {
                row.iter().enumerate().map(|(t, v)| v + 0.3 * (((c * 7 + t * 3) % 5) as f64 - 2.0)).collect()
            })
            .collect();
        rollout.old_logps = Some(old);
        rollout.ref_logps = objective.reference_logps(&rollout).unwrap();
        assert!(rollout.ref_logps.is_some());
        let pass = Pass::default();
        let (metrics, grads) = objective.loss_and_gradients(&model, &rollout, pass).unwrap();
        let host = host_loss(&objective, &model, &rollout);
        assert!((metrics.loss - host).abs() < 1e-5 * host.abs().max(1.0), "{loss:?}: {} vs {host}", metrics.loss);
        assert!(metrics.clip_region > 0.0 && metrics.kl.unwrap() > 0.0, "{metrics:?}");
        // Finite differences on a few entries of one adapter's A and B.
        let p = &params[3];
        for var in [&p.a, &p.b] {
            let analytic = grads.get(var.as_tensor()).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let values = var.as_tensor().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            for &k in &[0usize, 5, 17] {
                let h = 4e-3f32;
                let shifted = |delta: f32| {
                    let mut v = values.clone();
                    v[k] += delta;
                    var.set(&Tensor::from_vec(v, var.dims(), &Device::Cpu).unwrap()).unwrap();
                    let l = host_loss(&objective, &model, &rollout);
                    var.set(&Tensor::from_vec(values.clone(), var.dims(), &Device::Cpu).unwrap()).unwrap();
                    l
                };
                let numeric = (shifted(h) - shifted(-h)) / (2.0 * h as f64);
                // f32 losses: one percent of the gradient plus rounding noise; a wrong temperature factor is 43% off.
                let tolerance = 1e-2 * numeric.abs().max(analytic[k].abs() as f64) + 5e-5;
                assert!(
                    (numeric - analytic[k] as f64).abs() < tolerance,
                    "{loss:?} entry {k}: finite difference {numeric} vs gradient {}",
                    analytic[k]
                );
            }
        }
    }
}
