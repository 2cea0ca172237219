//! Crafted model files for the "nothing silently wrong" tests (issue 40): each case is a copy of a small
//! fixture with one thing made hostile (a size that asks for terabytes, a zero alignment, a FIFO where a
//! config belongs, NaN weights, two tensors sharing bytes, a name repeated, an index escaping the folder, a
//! template that asks for unbounded memory, ...), and the words its error must contain. The CLI test and
//! the studio test load the same cases.

use super::fixture;
use candle_core::quantized::gguf_file::Content;
use metal_candle::engine::export::from_candle_value;
use metal_candle::engine::export::gguf_writer::{write_gguf, MetaValue, TensorEntry};
use serde_json::json;
use std::path::{Path, PathBuf};

/// One crafted model: where it is and what its error must say.
pub struct HostileModel {
    pub name: &'static str,
    pub path: PathBuf,
    pub words: &'static [&'static str],
}

/// A copy of tiny-llama's folder at `dir/name`.
fn llama_copy(dir: &Path, name: &str) -> PathBuf {
    let out = dir.join(name);
    std::fs::create_dir_all(&out).unwrap();
    for entry in std::fs::read_dir(fixture("tiny-llama")).unwrap().flatten() {
        std::fs::copy(entry.path(), out.join(entry.file_name())).unwrap();
    }
    out
}

fn edit_json(path: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut value: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    edit(&mut value);
    std::fs::write(path, serde_json::to_string_pretty(&value).unwrap()).unwrap();
}

fn config_case(
    dir: &Path,
    name: &'static str,
    words: &'static [&'static str],
    edit: impl FnOnce(&mut serde_json::Value),
) -> HostileModel {
    let path = llama_copy(dir, name);
    edit_json(&path.join("config.json"), edit);
    HostileModel { name, path, words }
}

/// A safetensors header as (name, entry) pairs in file order, and the data after it.
fn read_safetensors(path: &Path) -> (Vec<(String, serde_json::Value)>, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    (header.into_iter().collect(), bytes[8 + n..].to_vec())
}

/// Write a header (names may repeat: it is written by hand) and data.
fn write_safetensors(path: &Path, entries: &[(String, serde_json::Value)], data: &[u8]) {
    let body: Vec<String> = entries.iter().map(|(k, v)| format!("{}:{v}", json!(k))).collect();
    let mut header = format!("{{{}}}", body.join(","));
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    std::fs::write(path, out).unwrap();
}

fn weights_case(
    dir: &Path,
    name: &'static str,
    words: &'static [&'static str],
    edit: impl FnOnce(&mut Vec<(String, serde_json::Value)>, &mut Vec<u8>),
) -> HostileModel {
    let path = llama_copy(dir, name);
    let file = path.join("model.safetensors");
    let (mut entries, mut data) = read_safetensors(&file);
    edit(&mut entries, &mut data);
    write_safetensors(&file, &entries, &data);
    HostileModel { name, path, words }
}

fn entry<'a>(entries: &'a mut [(String, serde_json::Value)], name: &str) -> &'a mut serde_json::Value {
    &mut entries.iter_mut().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no tensor {name}")).1
}

/// A named pipe at `path` (reading it blocks until a writer comes).
#[cfg(unix)]
pub fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo {}", path.display());
}

/// The Hugging Face folder cases (copies of tiny-llama).
pub fn hostile_folders(dir: &Path) -> Vec<HostileModel> {
    const Q: &str = "model.layers.0.self_attn.q_proj.weight";
    let q = Q;
    let mut cases = vec![
        config_case(dir, "context-1e11", &["max_position_embeddings", "100000000000"], |c| {
            c["max_position_embeddings"] = json!(100_000_000_000u64)
        }),
        config_case(dir, "context-0", &["max_position_embeddings", "outside"], |c| {
            c["max_position_embeddings"] = json!(0)
        }),
        config_case(dir, "layers-1e9", &["num_hidden_layers"], |c| c["num_hidden_layers"] = json!(1_000_000_000)),
        config_case(dir, "rope-garbage", &["rope_scaling", "not an object"], |c| c["rope_scaling"] = json!("garbage")),
        config_case(dir, "rope-negative", &["rope_scaling.factor", "-2"], |c| {
            c["rope_scaling"] = json!({"rope_type": "linear", "factor": -2.0})
        }),
        config_case(dir, "theta-0", &["rope_theta", "above 0"], |c| c["rope_theta"] = json!(0.0)),
        config_case(dir, "eps-negative", &["rms_norm_eps"], |c| c["rms_norm_eps"] = json!(-1e-5)),
        weights_case(dir, "q-as-u32", &[Q, "U32", "floating point"], |e, _| {
            entry(e, q)["dtype"] = json!("U32");
        }),
        weights_case(dir, "nan-weights", &[Q, "NaN"], |e, data| {
            let start = entry(e, q)["data_offsets"][0].as_u64().unwrap() as usize;
            data[start + 40..start + 44].copy_from_slice(&f32::NAN.to_le_bytes());
        }),
        weights_case(dir, "shared-bytes", &["share bytes"], |e, _| {
            let k = entry(e, "model.layers.0.self_attn.k_proj.weight")["data_offsets"].clone();
            entry(e, "model.layers.0.self_attn.v_proj.weight")["data_offsets"] = k;
        }),
        weights_case(dir, "named-twice", &[Q, "named twice"], |e, _| {
            let again = e.iter().find(|(n, _)| n == q).unwrap().clone();
            e.push(again);
        }),
    ];
    let escape = llama_copy(dir, "index-escape");
    std::fs::rename(escape.join("model.safetensors"), dir.join("elsewhere.safetensors")).unwrap();
    let weight_map: serde_json::Map<String, serde_json::Value> = read_safetensors(&dir.join("elsewhere.safetensors"))
        .0
        .into_iter()
        .filter(|(n, _)| n != "__metadata__")
        .map(|(n, _)| (n, json!("../elsewhere.safetensors")))
        .collect();
    std::fs::write(escape.join("model.safetensors.index.json"), json!({"weight_map": weight_map}).to_string()).unwrap();
    cases.push(HostileModel { name: "index-escape", path: escape, words: &["weight_map", "leaves the model folder"] });

    let eos = llama_copy(dir, "eos-past-vocab");
    edit_json(&eos.join("generation_config.json"), |g| g["eos_token_id"] = json!(999_999));
    cases.push(HostileModel {
        name: "eos-past-vocab",
        path: eos,
        words: &["generation_config.json", "999999", "past"],
    });

    #[cfg(unix)]
    {
        let fifo = llama_copy(dir, "config-fifo");
        std::fs::remove_file(fifo.join("config.json")).unwrap();
        mkfifo(&fifo.join("config.json"));
        cases.push(HostileModel { name: "config-fifo", path: fifo, words: &["config.json", "named pipe"] });

        let tok = llama_copy(dir, "tokenizer-fifo");
        std::fs::remove_file(tok.join("tokenizer.json")).unwrap();
        mkfifo(&tok.join("tokenizer.json"));
        cases.push(HostileModel { name: "tokenizer-fifo", path: tok, words: &["tokenizer.json", "named pipe"] });

        let zero = llama_copy(dir, "config-dev-zero");
        std::fs::remove_file(zero.join("config.json")).unwrap();
        std::os::unix::fs::symlink("/dev/zero", zero.join("config.json")).unwrap();
        cases.push(HostileModel {
            name: "config-dev-zero",
            path: zero,
            words: &["config.json", "/dev/zero", "device"],
        });

        let looped = llama_copy(dir, "config-loop");
        std::fs::remove_file(looped.join("config.json")).unwrap();
        std::os::unix::fs::symlink(looped.join("config.json"), looped.join("config.json")).unwrap();
        cases.push(HostileModel { name: "config-loop", path: looped, words: &["config.json", "loops"] });

        let weights_zero = llama_copy(dir, "weights-dev-zero");
        std::fs::remove_file(weights_zero.join("model.safetensors")).unwrap();
        std::os::unix::fs::symlink("/dev/zero", weights_zero.join("model.safetensors")).unwrap();
        cases.push(HostileModel {
            name: "weights-dev-zero",
            path: weights_zero,
            words: &["model.safetensors", "device"],
        });
    }
    cases
}

/// Chat templates for `generate --chat`: one that asks for unbounded memory, one whose output (7.8 MB) is far
/// more text than the context holds.
pub const HOSTILE_TEMPLATES: [(&str, &str, &[&str]); 2] = [
    (
        "template-memory",
        "{% set ns = namespace(s='x' * 1000000) %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
        &["chat_template.jinja", "memory"],
    ),
    ("template-megabytes", "{{ 'ab cd ' * 1300000 }}", &["7800000 bytes of text", "256 tokens"]),
];

/// A copy of tiny-llama named `name` with `template` as its chat_template.jinja.
pub fn with_template(dir: &Path, name: &str, template: &str) -> PathBuf {
    let path = llama_copy(dir, name);
    std::fs::write(path.join("chat_template.jinja"), template).unwrap();
    path
}

/// A GGUF as metadata, tensors and their bytes, to be edited and written back.
pub struct GgufParts {
    pub metadata: Vec<(String, MetaValue)>,
    pub tensors: Vec<TensorEntry>,
    pub data: Vec<Vec<u8>>,
}

/// Read a fixture GGUF into editable parts.
pub fn gguf_parts(path: &Path) -> GgufParts {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path).unwrap();
    let content = Content::read(&mut file).unwrap();
    let mut keys: Vec<&String> = content.metadata.keys().collect();
    keys.sort();
    let metadata = keys.into_iter().map(|k| (k.clone(), from_candle_value(&content.metadata[k]))).collect();
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let (mut tensors, mut data) = (Vec::new(), Vec::new());
    for name in names {
        let info = &content.tensor_infos[name];
        let entry = TensorEntry { name: name.clone(), dims: info.shape.dims().to_vec(), dtype: info.ggml_dtype };
        let mut bytes = vec![0u8; entry.size_bytes() as usize];
        file.seek(SeekFrom::Start(content.tensor_data_offset + info.offset)).unwrap();
        file.read_exact(&mut bytes).unwrap();
        tensors.push(entry);
        data.push(bytes);
    }
    GgufParts { metadata, tensors, data }
}

impl GgufParts {
    pub fn set(&mut self, key: &str, value: MetaValue) {
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some(entry) => entry.1 = value,
            None => self.metadata.push((key.to_string(), value)),
        }
    }

    pub fn write(&self, out: &Path) {
        write_gguf(out, &self.metadata, &self.tensors, |i| Ok(self.data[i].clone())).unwrap();
    }
}

fn gguf_case(
    dir: &Path,
    name: &'static str,
    words: &'static [&'static str],
    edit: impl FnOnce(&mut GgufParts),
) -> HostileModel {
    let mut parts = gguf_parts(&fixture("gguf/tiny-mistral-f32.gguf"));
    edit(&mut parts);
    let path = dir.join(format!("{name}.gguf"));
    parts.write(&path);
    HostileModel { name, path, words }
}

/// The GGUF cases (edits of the tiny-mistral fixture, a `llama` architecture file).
pub fn hostile_ggufs(dir: &Path) -> Vec<HostileModel> {
    let mut cases = vec![
        gguf_case(dir, "gguf-context-2^40", &["llama.context_length", "1099511627776"], |p| {
            p.set("llama.context_length", MetaValue::U64(1 << 40))
        }),
        gguf_case(dir, "gguf-blocks-1e9", &["llama.block_count", "1000000000"], |p| {
            p.set("llama.block_count", MetaValue::U32(1_000_000_000))
        }),
        gguf_case(dir, "gguf-alignment-0", &["general.alignment", "power of two"], |p| {
            p.set("general.alignment", MetaValue::U32(0))
        }),
        gguf_case(dir, "gguf-key-twice", &["llama.block_count", "appears twice"], |p| {
            p.metadata.push(("llama.block_count".into(), MetaValue::U32(1)))
        }),
        gguf_case(dir, "gguf-tensor-twice", &["blk.0.attn_q.weight", "listed twice"], |p| {
            let i = p.tensors.iter().position(|t| t.name == "blk.0.attn_q.weight").unwrap();
            let (t, d) = (p.tensors[i].clone(), p.data[i].clone());
            p.tensors.push(t);
            p.data.push(d);
        }),
        gguf_case(dir, "gguf-nan", &["blk.0.attn_k.weight", "NaN"], |p| {
            let i = p.tensors.iter().position(|t| t.name == "blk.0.attn_k.weight").unwrap();
            p.data[i][8..12].copy_from_slice(&f32::INFINITY.to_le_bytes());
        }),
        gguf_case(dir, "gguf-eps-negative", &["layer_norm_rms_epsilon"], |p| {
            p.set("llama.attention.layer_norm_rms_epsilon", MetaValue::F32(-1e-5))
        }),
    ];
    // A key whose declared length is 2^40 bytes: the first key's length field, patched in place.
    let huge = dir.join("gguf-string-2^40.gguf");
    let mut bytes = std::fs::read(&cases[0].path).unwrap();
    bytes[24..32].copy_from_slice(&(1u64 << 40).to_le_bytes());
    std::fs::write(&huge, bytes).unwrap();
    cases.push(HostileModel {
        name: "gguf-string-2^40",
        path: huge,
        words: &["declares", "bytes of the file are left"],
    });
    cases
}
