//! The fused CUDA decode kernels against the CPU: step-by-step logits of a KV-cache decode on every tiny
//! architecture (built with `--features cuda`; skipped without a GPU). Run on a lent GPU machine.
#![cfg(feature = "cuda")]

use candle_core::{DType, Device, Tensor};
use metal_candle::engine::generate::KvCache;
use metal_candle::engine::model::load_model;

fn logits_per_step(model_dir: &str, device: &Device, dtype: DType, prompt: &[u32], steps: usize) -> Vec<Vec<f32>> {
    let loaded = load_model(std::path::Path::new(model_dir), device, dtype).unwrap();
    let model = &loaded.model;
    let mut cache = KvCache::new(model.config.num_layers);
    let mut out = Vec::new();
    let mut ids = prompt.to_vec();
    let mut pos = 0;
    for step in 0..=steps {
        let input = if step == 0 { ids.clone() } else { vec![*ids.last().unwrap()] };
        let t = input.len();
        let input = Tensor::from_vec(input, (1, t), device).unwrap();
        let hidden = model.forward_hidden(&input, pos, Some(&mut cache)).unwrap();
        pos += t;
        let last = hidden.narrow(1, t - 1, 1).unwrap().squeeze(1).unwrap();
        let logits: Vec<f32> =
            model.logits(&last).unwrap().to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        // Follow the CPU-independent argmax so both runs see the same tokens: a fixed pseudo-random walk.
        ids.push(((step * 7919 + 13) % model.config.vocab_size) as u32);
        out.push(logits);
    }
    out
}

#[test]
fn fused_decode_logits_match_the_cpu_on_every_architecture() {
    let Ok(cuda) = Device::new_cuda(0) else {
        eprintln!("no CUDA device: skipped");
        return;
    };
    let prompt = [281u32, 358, 289, 422, 348];
    for arch in ["tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-qwen3"] {
        let dir = format!("tests/fixtures/{arch}");
        let want = logits_per_step(&dir, &Device::Cpu, DType::F32, &prompt, 80);
        let got = logits_per_step(&dir, &cuda, DType::F32, &prompt, 80);
        let diffs: Vec<f32> = want
            .iter()
            .zip(&got)
            .map(|(a, b)| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max))
            .collect();
        eprintln!(
            "{arch}: max |logit diff| per step: {:?}",
            &diffs.iter().map(|d| format!("{d:.1e}")).collect::<Vec<_>>()
        );
        assert!(diffs.iter().all(|d| *d < 1e-3), "{arch}: CUDA decode differs from the CPU");
    }
}
