//! The KV cache: per layer, keys and values in one buffer that grows by doubling and is written in place, so
//! decoding never copies the whole cache per token. A captured decode step (model/decode_graph.rs) also keeps
//! here the device tensor its kernels read the position from.

use candle_core::Tensor;

/// Keys and values of one layer in one buffer (2, b, kv_heads, capacity, head_dim), keys first, of which `len`
/// positions are used. One buffer lets the fused CUDA decode write both with a single launch.
#[derive(Debug, Default)]
pub struct LayerCache {
    kv: Option<Tensor>,
    len: usize,
    /// A u32 tensor of one element on the device holding `len`, written before each replay of a captured
    /// decode step; the fused decode kernels read the position from it (see `cuda_decode::kv_write`).
    device_position: Option<Tensor>,
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
        if self.len + extra > self.capacity() {
            self.reallocate((self.len + extra).next_power_of_two().max(64), b, kv_heads, head_dim, dtype, device)?;
        }
        match &self.kv {
            Some(buf) => Ok(buf.clone()),
            None => candle_core::bail!("kv cache buffer missing"),
        }
    }

    /// Positions the buffer holds (0 before the first write).
    pub fn capacity(&self) -> usize {
        self.kv.as_ref().map_or(0, |c| c.dims().get(3).copied().unwrap_or(0))
    }

    /// Grow an existing buffer to hold at least `positions` (nothing to do before the first write: the buffer's
    /// shape is not known yet).
    pub fn grow_to(&mut self, positions: usize) -> candle_core::Result<()> {
        let Some(buf) = &self.kv else { return Ok(()) };
        if positions <= self.capacity() {
            return Ok(());
        }
        let (_, b, kv_heads, _, head_dim) = buf.dims5()?;
        let (dtype, device) = (buf.dtype(), buf.device().clone());
        self.reallocate(positions, b, kv_heads, head_dim, dtype, &device)
    }

    /// A new zeroed buffer of `capacity` positions holding the cached ones.
    fn reallocate(
        &mut self,
        capacity: usize,
        b: usize,
        kv_heads: usize,
        head_dim: usize,
        dtype: candle_core::DType,
        device: &candle_core::Device,
    ) -> candle_core::Result<()> {
        let buf = Tensor::zeros((2, b, kv_heads, capacity, head_dim), dtype, device)?;
        if let (Some(old), true) = (&self.kv, self.len > 0) {
            buf.slice_set(&old.narrow(3, 0, self.len)?.contiguous()?, 3, 0)?;
        }
        self.kv = Some(buf);
        Ok(())
    }

    /// The device tensor holding the position, when a captured decode step reads it from there.
    pub fn device_position(&self) -> Option<&Tensor> {
        self.device_position.as_ref()
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

    /// Positions every layer's buffer holds (0 before the first write).
    pub fn capacity(&self) -> usize {
        self.layers.iter().map(LayerCache::capacity).min().unwrap_or(0)
    }

    /// Grow every layer's buffer to hold at least `positions` (see [`LayerCache::grow_to`]).
    pub fn grow_to(&mut self, positions: usize) -> candle_core::Result<()> {
        self.layers.iter_mut().try_for_each(|l| l.grow_to(positions))
    }

    /// Count `n` positions written into every layer (a replayed decode step wrote them).
    pub fn advance(&mut self, n: usize) {
        self.layers.iter_mut().for_each(|l| l.advance(n));
    }

    /// Forget positions from `len` on in every layer (their contents are overwritten by the next writes).
    pub fn truncate(&mut self, len: usize) {
        self.layers.iter_mut().for_each(|l| l.len = l.len.min(len));
    }

    /// Copy a one-sequence cache into `n` sequences (a prompt prefilled once, then decoded n ways: GRPO's group).
    pub fn repeat_batch(&mut self, n: usize) -> candle_core::Result<()> {
        for layer in &mut self.layers {
            if let Some(buf) = &layer.kv {
                if buf.dim(1)? != 1 {
                    candle_core::bail!("only a one-sequence cache can be repeated");
                }
                layer.kv = Some(Tensor::cat(&vec![buf.clone(); n], 1)?);
            }
        }
        Ok(())
    }

    /// Caches of the same length side by side as one batch (their sequences in order).
    pub fn concat_batch(caches: Vec<KvCache>) -> candle_core::Result<Self> {
        let mut caches = caches.into_iter();
        let Some(mut first) = caches.next() else { return Ok(Self::default()) };
        let rest: Vec<KvCache> = caches.collect();
        if rest.is_empty() {
            return Ok(first);
        }
        for (i, layer) in first.layers.iter_mut().enumerate() {
            let mut parts = vec![];
            for cache in std::iter::once(&*layer).chain(rest.iter().map(|c| &c.layers[i])) {
                if cache.len != layer.len || cache.capacity() != layer.capacity() {
                    candle_core::bail!("only caches of the same length can be batched");
                }
                parts.extend(cache.kv.clone());
            }
            if !parts.is_empty() {
                layer.kv = Some(Tensor::cat(&parts, 1)?);
            }
        }
        Ok(first)
    }

    /// Have the fused decode kernels read the position from `position` (see [`LayerCache::device_position`]),
    /// or again from the host (None).
    pub fn set_device_position(&mut self, position: Option<&Tensor>) {
        self.layers.iter_mut().for_each(|l| l.device_position = position.cloned());
    }
}
