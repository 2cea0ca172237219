//! GGUF metadata: typed access to its key/value pairs ([`Metadata`]) and the file's architecture ([`GgufArch`],
//! whose name prefixes every hyperparameter key: `llama.*`, `qwen2.*`, `gemma3.*`, ...). Turning those keys into a
//! model config is `resolve.rs`'s (the common keys) and `families.rs`'s (what some families add).

use super::arch::{architecture_of_gguf, SUPPORTED_GGUF_ARCHITECTURES};
use crate::engine::model::config::Architecture;
use crate::engine::{Error, Result};
use candle_core::quantized::gguf_file::Value;
use std::collections::HashMap;
use std::path::Path;

/// Typed access to GGUF metadata; a value of the wrong type is a `BadConfig` naming the key.
pub(super) struct Metadata<'a> {
    pub(super) path: &'a Path,
    pub(super) map: &'a HashMap<String, Value>,
}

impl Metadata<'_> {
    pub(super) fn bad(&self, key: &str, message: impl Into<String>) -> Error {
        Error::BadConfig { path: self.path.to_path_buf(), field: key.into(), message: message.into() }
    }

    pub(super) fn usize(&self, key: &str) -> Result<Option<usize>> {
        self.map
            .get(key)
            .map(|v| value_to_usize(v).ok_or_else(|| self.bad(key, "expected a non-negative integer")))
            .transpose()
    }

    pub(super) fn need_usize(&self, key: &str) -> Result<usize> {
        match self.usize(key)? {
            Some(v) if v > 0 => Ok(v),
            Some(_) => Err(self.bad(key, "must be positive")),
            None => Err(self.bad(key, "missing from the GGUF metadata")),
        }
    }

    pub(super) fn float(&self, key: &str) -> Result<Option<f64>> {
        self.map.get(key).map(|v| value_to_f64(v).ok_or_else(|| self.bad(key, "expected a number"))).transpose()
    }

    pub(super) fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.map.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(self.bad(key, "expected a boolean")),
        }
    }

    pub(super) fn string(&self, key: &str) -> Result<Option<&str>> {
        match self.map.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(_) => Err(self.bad(key, "expected a string")),
        }
    }

    pub(super) fn array(&self, key: &str) -> Result<Option<&[Value]>> {
        match self.map.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => Ok(Some(items.as_slice())),
            Some(_) => Err(self.bad(key, "expected an array")),
        }
    }

    pub(super) fn strings(&self, key: &str) -> Result<Option<Vec<String>>> {
        let Some(items) = self.array(key)? else { return Ok(None) };
        let strings = items.iter().map(|v| match v {
            Value::String(s) => Ok(s.clone()),
            _ => Err(self.bad(key, "expected an array of strings")),
        });
        strings.collect::<Result<Vec<_>>>().map(Some)
    }

    pub(super) fn ints(&self, key: &str) -> Result<Option<Vec<i64>>> {
        let Some(items) = self.array(key)? else { return Ok(None) };
        let ints = items.iter().map(|v| value_to_i64(v).ok_or_else(|| self.bad(key, "expected an array of integers")));
        ints.collect::<Result<Vec<_>>>().map(Some)
    }

    pub(super) fn floats(&self, key: &str) -> Result<Option<Vec<f32>>> {
        let Some(items) = self.array(key)? else { return Ok(None) };
        let floats = items
            .iter()
            .map(|v| value_to_f64(v).map(|x| x as f32).ok_or_else(|| self.bad(key, "expected an array of numbers")));
        floats.collect::<Result<Vec<_>>>().map(Some)
    }

    pub(super) fn token_id(&self, key: &str) -> Result<Option<u32>> {
        self.usize(key)?.map(|v| u32::try_from(v).map_err(|_| self.bad(key, "token id out of range"))).transpose()
    }
}

fn value_to_i64(v: &Value) -> Option<i64> {
    match *v {
        Value::U8(x) => Some(x.into()),
        Value::I8(x) => Some(x.into()),
        Value::U16(x) => Some(x.into()),
        Value::I16(x) => Some(x.into()),
        Value::U32(x) => Some(x.into()),
        Value::I32(x) => Some(x.into()),
        Value::U64(x) => i64::try_from(x).ok(),
        Value::I64(x) => Some(x),
        _ => None,
    }
}

fn value_to_usize(v: &Value) -> Option<usize> {
    value_to_i64(v).and_then(|x| usize::try_from(x).ok())
}

fn value_to_f64(v: &Value) -> Option<f64> {
    match *v {
        // Through the shortest decimal, so an f32 `1e-5` becomes the f64 `1e-5` a config.json would give.
        Value::F32(x) => Some(x.to_string().parse().unwrap_or(x.into())),
        Value::F64(x) => Some(x),
        _ => value_to_i64(v).map(|x| x as f64),
    }
}

/// The file's architecture: llama.cpp's name (the prefix of its hyperparameter keys) and ours.
pub(super) struct GgufArch {
    pub(super) name: String,
    pub(super) architecture: Architecture,
}

impl GgufArch {
    /// The full key of hyperparameter `name` (`qwen2.block_count`).
    pub(super) fn key(&self, name: &str) -> String {
        format!("{}.{name}", self.name)
    }
}

/// `general.architecture`, refused unless we run it; a `llama` file is a Mistral model when its recorded
/// name says so (see `arch.rs`).
pub(super) fn check_architecture(meta: &Metadata) -> Result<GgufArch> {
    let found = meta.string("general.architecture")?.unwrap_or("(no general.architecture)");
    let names: Vec<&str> =
        ["general.basename", "general.name"].iter().filter_map(|k| meta.string(k).ok().flatten()).collect();
    match architecture_of_gguf(found, &names) {
        Some(architecture) => Ok(GgufArch { name: found.to_string(), architecture }),
        None => Err(Error::UnsupportedArchitecture {
            found: found.to_string(),
            path: meta.path.to_path_buf(),
            supported: SUPPORTED_GGUF_ARCHITECTURES.into(),
        }),
    }
}
