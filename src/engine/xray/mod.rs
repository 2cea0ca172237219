//! The adapter X-ray: what a trained LoRA adapter learned, per adapted linear, from the saved weights alone.
//! For every module: the singular values of its scaled update `scale * B A` (scale alpha/r, or alpha/sqrt(r) for
//! rsLoRA), the update's Frobenius norm, that norm relative to the frozen weight's (when the base model is here),
//! and the energy ranks (the fewest singular values holding 50%, 90%, 99% of the squared norm). A summary
//! recommends a rank: the largest energy rank 90 over modules, rounded up to a power of two.
//!
//! How: no d_out x d_in product is formed. A thin QR of B and of A^T, then the SVD of the r x r core
//! (`spectrum.rs`), in f64 with our own Householder QR and one-sided Jacobi SVD (`linalg.rs`, which says why).
//! DoRA adapters: the spectrum is that of the directional low-rank update `scale * B A`; the trained magnitude is
//! reported beside it as `magnitude_change`, its relative distance from the frozen weight's row norms (where
//! PEFT starts it).
//!
//! Reads our checkpoints and PEFT adapters from elsewhere through `checkpoint`'s one adapter reader.
//! - base.rs: which base model to measure against, and the frozen weights' norms;
//! - linalg.rs: thin QR's R and Jacobi singular values;
//! - spectrum.rs: one module's singular values and energy ranks;
//! - summary.rs: the rank recommendation and its reason.

mod base;
mod linalg;
mod spectrum;
mod summary;

pub use base::{find_base, BaseChoice};
pub use spectrum::{energy_rank, update_singular_values};
pub use summary::recommend;

use crate::engine::checkpoint::{self, AdapterWeights};
use crate::engine::lora::Target;
use crate::engine::model::base_tensors::BaseTensors;
use crate::engine::model::load_model_info;
use crate::engine::model::transformer::hf_linear_name;
use crate::engine::{Error, Result};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// One adapted linear's update.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModuleXray {
    /// The linear's Hugging Face name, `model.layers.N.<group>.<module>`.
    pub name: String,
    pub layer: usize,
    pub module: String,
    /// The r singular values of `scale * B A`, largest first.
    pub singular_values: Vec<f64>,
    /// Frobenius norm of `scale * B A`.
    pub update_norm: f64,
    /// `update_norm` over the frozen weight's Frobenius norm; None without the base model.
    pub relative_norm: Option<f64>,
    pub energy_rank_50: usize,
    pub energy_rank_90: usize,
    pub energy_rank_99: usize,
    /// DoRA only (with the base): `||m - ||W||_row|| / ||(||W||_row)||`, how far the magnitude moved from where
    /// PEFT starts it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub magnitude_change: Option<f64>,
}

/// The rank recommendation.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct XraySummary {
    /// The largest energy rank 90 over modules rounded up to a power of two; None when every update is zero.
    pub recommended_rank: Option<usize>,
    /// Why, in words (which module decided it).
    pub reason: String,
}

/// The X-ray of one adapter folder.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct XrayReport {
    pub checkpoint: PathBuf,
    pub rank: usize,
    pub alpha: f64,
    pub use_rslora: bool,
    pub use_dora: bool,
    /// The multiplier of `B A`: alpha/r, or alpha/sqrt(r) with rsLoRA.
    pub scale: f64,
    /// The base model the relative norms are against; None when it is not here.
    pub base_model: Option<PathBuf>,
    /// What the reader should know: the base that is missing, a base the adapter was not trained on.
    pub notes: Vec<String>,
    /// In model order: by layer, then attention before MLP.
    pub modules: Vec<ModuleXray>,
    pub summary: XraySummary,
    pub elapsed_secs: f64,
}

impl XrayReport {
    /// The layers that have adapted modules, in order.
    pub fn layers(&self) -> Vec<usize> {
        let mut layers: Vec<usize> = self.modules.iter().map(|m| m.layer).collect();
        layers.dedup();
        layers
    }

    /// The adapted module names, in model order.
    pub fn module_names(&self) -> Vec<String> {
        Target::ALL
            .iter()
            .map(|t| t.name().to_string())
            .filter(|n| self.modules.iter().any(|m| &m.module == n))
            .collect()
    }

    /// The module of `layer` named `module`, if adapted.
    pub fn module(&self, layer: usize, module: &str) -> Option<&ModuleXray> {
        self.modules.iter().find(|m| m.layer == layer && m.module == module)
    }
}

/// X-ray the adapter in `ckpt` (a checkpoint of ours or any PEFT LoRA adapter folder) against `base`
/// ([`find_base`]). A base that is named but unreadable, or that the adapter does not fit, is an error; a base
/// that is [`BaseChoice::Missing`] leaves every `relative_norm` None and says why in `notes`.
pub fn inspect(ckpt: &Path, base: &BaseChoice) -> Result<XrayReport> {
    let started = Instant::now();
    if !ckpt.is_dir() {
        return Err(Error::MissingFile {
            path: ckpt.to_path_buf(),
            what: "a checkpoint or adapter folder (adapter_config.json + adapter_model.safetensors)".into(),
        });
    }
    let mut notes = Vec::new();
    let (weights, mut frozen) = match base {
        BaseChoice::Found(path) => {
            let info = load_model_info(path)?;
            let weights = checkpoint::read_adapter_for(&info.config, ckpt)?;
            if let Some(warning) = checkpoint::base_mismatch_of(ckpt, &info.source, &info.config)? {
                notes.push(warning);
            }
            (weights, Some((BaseTensors::open(&info.source)?, info.config, path.clone())))
        }
        BaseChoice::Missing(reason) => {
            notes.push(format!("relative norms are left out: {reason}"));
            (checkpoint::read_adapter_alone(ckpt)?, None)
        }
    };
    let AdapterWeights { config, mut pairs, .. } = weights;
    let order = |m: &str| Target::ALL.iter().position(|t| t.name() == m).unwrap_or(usize::MAX);
    pairs.sort_by_key(|(layer, module, ..)| (*layer, order(module)));
    let scale = config.scale();
    let mut modules = Vec::with_capacity(pairs.len());
    for (layer, module, a, b, magnitude) in &pairs {
        let values = update_singular_values(
            &a.flatten_all()?.to_vec1::<f32>()?,
            &b.flatten_all()?.to_vec1::<f32>()?,
            config.r,
            scale,
        );
        let update_norm = spectrum::frobenius(&values);
        let (mut relative_norm, mut magnitude_change) = (None, None);
        if let Some((tensors, model_config, _)) = frozen.as_mut() {
            let w = base::frozen_norms(tensors, model_config, *layer, module)?;
            relative_norm = Some(if w.frobenius > 0.0 { update_norm / w.frobenius } else { f64::INFINITY });
            if let Some(m) = magnitude {
                let m = m.to_vec1::<f32>()?;
                let moved = m.iter().zip(&w.row_norms).map(|(m, n)| (*m as f64 - n).powi(2)).sum::<f64>().sqrt();
                magnitude_change = Some(moved / w.frobenius.max(f64::MIN_POSITIVE));
            }
        }
        modules.push(ModuleXray {
            name: hf_linear_name(*layer, module),
            layer: *layer,
            module: module.to_string(),
            energy_rank_50: energy_rank(&values, 0.5),
            energy_rank_90: energy_rank(&values, 0.9),
            energy_rank_99: energy_rank(&values, 0.99),
            singular_values: values,
            update_norm,
            relative_norm,
            magnitude_change,
        });
    }
    let summary = recommend(&modules, config.r);
    Ok(XrayReport {
        checkpoint: ckpt.to_path_buf(),
        rank: config.r,
        alpha: config.lora_alpha,
        use_rslora: config.use_rslora,
        use_dora: config.use_dora,
        scale,
        base_model: frozen.map(|(_, _, path)| path),
        notes,
        modules,
        summary,
        elapsed_secs: started.elapsed().as_secs_f64(),
    })
}
