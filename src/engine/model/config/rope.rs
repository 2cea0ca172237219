//! `rope_theta` and `rope_scaling` (or transformers 5's `rope_parameters`) of a raw config.json, resolved to
//! the rope base and the scaling variant we implement; any other scaling type, or one that is not an object, is
//! refused naming the field.

use super::{Llama3RopeScaling, RawConfig, RopeScaling};
use crate::engine::{Error, Result};
use std::path::Path;

impl RawConfig {
    pub(super) fn resolve_rope(
        &self,
        path: &Path,
        max_position_embeddings: usize,
        rotary_dim: usize,
    ) -> Result<(f64, Option<RopeScaling>)> {
        let params = self.rope_parameters_of("full_attention");
        let theta = self
            .rope_theta
            .or_else(|| params.and_then(|p| p.get("rope_theta")).and_then(|v| v.as_f64()))
            .unwrap_or(10_000.0);
        let scaling = self.rope_scaling.as_ref().filter(|v| !v.is_null()).or(params);
        let Some(scaling) = scaling else {
            return Ok((theta, None));
        };
        if !scaling.is_object() {
            return Err(Error::BadConfig {
                path: path.to_path_buf(),
                field: "rope_scaling".into(),
                message: format!(
                    "{scaling} is not an object like {{\"rope_type\": \"linear\", \"factor\": 2.0}} or null"
                ),
            });
        }
        let kind =
            scaling.get("rope_type").or_else(|| scaling.get("type")).and_then(|v| v.as_str()).unwrap_or("default");
        let num = |field: &str| -> Result<f64> {
            scaling.get(field).and_then(|v| v.as_f64()).ok_or_else(|| Error::BadConfig {
                path: path.to_path_buf(),
                field: format!("rope_scaling.{field}"),
                message: "missing".into(),
            })
        };
        let resolved = match kind {
            "default" => None,
            "linear" => Some(RopeScaling::Linear { factor: num("factor")? }),
            "llama3" => Some(RopeScaling::Llama3(Llama3RopeScaling {
                factor: num("factor")?,
                low_freq_factor: num("low_freq_factor")?,
                high_freq_factor: num("high_freq_factor")?,
                original_max_position_embeddings: num("original_max_position_embeddings")? as usize,
            })),
            "longrope" => {
                Some(RopeScaling::LongRope(self.long_rope(scaling, path, max_position_embeddings, rotary_dim)?))
            }
            other => {
                return Err(Error::BadConfig {
                    path: path.to_path_buf(),
                    field: "rope_scaling.rope_type".into(),
                    message: format!("`{other}` is not supported; supported: default, linear, llama3, longrope"),
                })
            }
        };
        Ok((theta, resolved))
    }
}
