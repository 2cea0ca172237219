//! The steps of token-by-token decoding: each gives the logits of the last id after running the ids the KV
//! cache lacks. On CUDA, once the model's single-token step runs entirely on the device
//! ([`Transformer::decode_step_stays_on_device`]), the step is captured as a CUDA graph (ops/cuda/graph.rs) and
//! every later token replays it with one launch instead of ~160 host launches.
//!
//! The sequence for one generation: the prompt runs eagerly (prefill); the first decoded token runs eagerly
//! with Candle's parameter cache on (a warm-up that fills it); the second is captured and launched; the rest
//! replay. The replayed step reads its token and position from a small device buffer written before each
//! launch, and writes its logits into a buffer allocated before the capture. The KV cache is grown before the
//! capture to hold every position the generation can reach; should it fill anyway, the graph is dropped and
//! the steps warm up and capture again. If a capture fails (some op of an adapter or a quantized format
//! reads back to the host, say), decoding goes on eagerly, with the same results, and the reason is kept.

use super::kv_cache::KvCache;
use super::transformer::Transformer;
use crate::engine::ops::cuda::graph::{self as cuda_graph, Graph};
use crate::engine::Result;
use candle_core::{DType, Tensor};

/// Decoding steps for one generation (one KV cache).
pub struct DecodeSteps {
    /// How many positions this generation can reach: the cache is grown to hold them before a capture.
    positions: usize,
    state: State,
    replays: usize,
    fallback: Option<String>,
}

enum State {
    /// Graphs are off (not asked for, not supported, or a capture failed): every step runs eagerly.
    Eager,
    /// The next single-token step warms Candle's parameter cache.
    Warm,
    /// The next single-token step is captured.
    Capture,
    Replay(CapturedStep),
}

/// A captured single-token step and the buffers it reads and writes outside the graph.
struct CapturedStep {
    graph: Graph,
    /// (2,) u32: the token's id, then its position.
    inputs: Tensor,
    /// (1, vocab) f32.
    logits: Tensor,
    /// Positions the KV cache held at the capture: a replay writes position `len`, so `len < capacity`.
    capacity: usize,
}

impl DecodeSteps {
    /// Steps for `model` over a generation that reaches `positions` positions; with `graphs`, captured on CUDA
    /// when the model's step allows it.
    pub fn new(model: &Transformer, positions: usize, graphs: bool) -> Self {
        let graphed = graphs && cuda_graph::supported(model.device()) && model.decode_step_stays_on_device();
        Self { positions, state: if graphed { State::Warm } else { State::Eager }, replays: 0, fallback: None }
    }

    /// Steps as the runtime options ask (graphs unless `--no-cuda-graphs`).
    pub fn for_generation(model: &Transformer, positions: usize) -> Self {
        Self::new(model, positions, crate::engine::runtime::options().cuda_graphs)
    }

    /// Tokens decoded so far by launching a captured graph (the capture's own launch included).
    pub fn replays(&self) -> usize {
        self.replays
    }

    /// Why graphs stopped being used, when a capture failed.
    pub fn fallback(&self) -> Option<&str> {
        self.fallback.as_deref()
    }

    /// Logits (1, vocab) f32 of the last of `ids` (one sequence), after running those `cache` does not hold
    /// yet. The returned tensor of a replayed step is overwritten by the next replay: read it first.
    pub fn next_logits(&mut self, model: &Transformer, ids: &[u32], cache: &mut KvCache) -> Result<Tensor> {
        let pos = cache.len();
        if let State::Replay(step) = &self.state {
            if pos < step.capacity && ids.len() == pos + 1 {
                let logits = step.replay(ids[pos], pos, cache)?;
                self.replays += 1;
                return Ok(logits);
            }
            // The cache is full (capture again once it has grown), or this is not a single-token step.
            cache.set_device_position(None);
            self.state = State::Warm;
        }
        if pos == 0 || ids.len() != pos + 1 {
            return model.forward_last_cached(ids, cache);
        }
        match self.state {
            State::Eager | State::Replay(_) => model.forward_last_cached(ids, cache),
            State::Warm => {
                // The token is uploaded outside the cache's scope: its uploads are kept, shared, for good.
                let token = Tensor::new(&ids[pos..], model.device())?.unsqueeze(0)?;
                let logits =
                    cuda_graph::with_param_cache(model.device(), || model.forward_last(&token, pos, Some(cache)))?;
                self.state = State::Capture;
                Ok(logits)
            }
            State::Capture => match CapturedStep::capture(model, ids[pos], cache, self.positions) {
                Ok(step) => {
                    let logits = step.logits.clone();
                    self.state = State::Replay(step);
                    self.replays += 1;
                    Ok(logits)
                }
                Err(e) => {
                    self.fallback = Some(e.to_string());
                    self.state = State::Eager;
                    model.forward_last_cached(ids, cache)
                }
            },
        }
    }
}

impl CapturedStep {
    /// Capture the step that decodes `id` at position `cache.len()`, and launch it once (it decodes `id`).
    /// On failure the cache is as it was (no position written, none counted).
    fn capture(model: &Transformer, id: u32, cache: &mut KvCache, positions: usize) -> Result<Self> {
        let (device, pos) = (model.device(), cache.len());
        // Room for every position this generation can reach: replays cannot grow the cache.
        cache.grow_to(positions.max(pos + 1))?;
        let capacity = cache.capacity();
        // Allocated before the capture and outside Candle's parameter cache (whose uploads are shared).
        let inputs = Tensor::new(&[id, pos as u32], device)?;
        let logits = Tensor::zeros((1, model.config.vocab_size), DType::F32, device)?;
        let token = inputs.narrow(0, 0, 1)?.unsqueeze(0)?;
        cache.set_device_position(Some(&inputs.narrow(0, 1, 1)?));
        let captured = cuda_graph::with_param_cache(device, || {
            Graph::capture(device, || {
                let step_logits = model.forward_last(&token, pos, Some(cache))?;
                logits.slice_set(&step_logits, 0, 0)?;
                Ok(())
            })
        });
        match captured {
            Ok(graph) => {
                graph.launch()?;
                Ok(Self { graph, inputs, logits, capacity })
            }
            Err(e) => {
                cache.truncate(pos);
                cache.set_device_position(None);
                Err(e)
            }
        }
    }

    /// Decode `id` at position `pos` (= `cache.len()` < capacity) by one launch.
    fn replay(&self, id: u32, pos: usize, cache: &mut KvCache) -> Result<Tensor> {
        cuda_graph::write_u32s(&self.inputs, &[id, pos as u32])?;
        self.graph.launch()?;
        cache.advance(1);
        Ok(self.logits.clone())
    }
}
