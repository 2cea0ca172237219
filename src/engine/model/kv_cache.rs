//! The KV cache: per layer, keys and values in one buffer that grows by doubling and is written in place, so
//! decoding never copies the whole cache per token.

use candle_core::Tensor;

/// Keys and values of one layer in one buffer (2, b, kv_heads, capacity, head_dim), keys first, of which `len`
/// positions are used. One buffer lets the fused CUDA decode write both with a single launch.
#[derive(Debug, Default)]
pub struct LayerCache {
    kv: Option<Tensor>,
    len: usize,
}

impl LayerCache {
    /// Append new keys/values (b, kv_heads, t, head_dim) and return views of everything cached so far.
    pub fn append(&mut self, k: &Tensor, v: &Tensor) -> candle_core::Result<(Tensor, Tensor)> {
        let (b, kv_heads, t, head_dim) = k.dims4()?;
        let buf = self.reserve(b, kv_heads, head_dim, t, k.dtype(), k.device())?;
        buf.slice_set(&Tensor::stack(&[k, v], 0)?, 3, self.len)?;
        self.len += t;
        Ok((buf.get(0)?.narrow(2, 0, self.len)?, buf.get(1)?.narrow(2, 0, self.len)?))
    }

    /// The buffer, grown (by doubling) to hold `extra` more positions; their contents are for the caller
    /// to write before [`LayerCache::advance`].
    pub fn reserve(
        &mut self,
        b: usize,
        kv_heads: usize,
        head_dim: usize,
        extra: usize,
        dtype: candle_core::DType,
        device: &candle_core::Device,
    ) -> candle_core::Result<Tensor> {
        let capacity = self.kv.as_ref().map(|c| c.dim(3)).transpose()?.unwrap_or(0);
        if self.len + extra > capacity {
            let new_capacity = (self.len + extra).next_power_of_two().max(64);
            let buf = Tensor::zeros((2, b, kv_heads, new_capacity, head_dim), dtype, device)?;
            if let (Some(old), true) = (&self.kv, self.len > 0) {
                buf.slice_set(&old.narrow(3, 0, self.len)?.contiguous()?, 3, 0)?;
            }
            self.kv = Some(buf);
        }
        match &self.kv {
            Some(buf) => Ok(buf.clone()),
            None => candle_core::bail!("kv cache buffer missing"),
        }
    }

    /// Count `n` positions written into the reserved buffer.
    pub fn advance(&mut self, n: usize) {
        self.len += n;
    }

    /// Cached positions.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// One cache per decoder layer.
#[derive(Debug, Default)]
pub struct KvCache {
    layers: Vec<LayerCache>,
}

impl KvCache {
    pub fn new(num_layers: usize) -> Self {
        Self { layers: (0..num_layers).map(|_| LayerCache::default()).collect() }
    }

    pub fn layer(&mut self, i: usize) -> &mut LayerCache {
        &mut self.layers[i]
    }

    /// Number of cached positions.
    pub fn len(&self) -> usize {
        self.layers.first().map(LayerCache::len).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
