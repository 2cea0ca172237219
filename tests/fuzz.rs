//! Fuzz targets for the three readers of strangers' files (issue 40): the safetensors header (through a whole
//! model load), the GGUF reader (header, config, tokenizer, tensors) and the chat template renderer. A
//! mutation fuzzer, seeded from real fixtures, runs each for `FUZZ_SECS` seconds (10 by default, so CI runs
//! them on every push; `FUZZ_SECS=600 cargo test --release --test fuzz -- --nocapture` for a long run) with
//! `FUZZ_SEED` to replay. An input fails the target when it panics out of the engine (a caught panic inside
//! the engine is counted and reported), aborts the process (the test dies) or takes over 20 s.
//! Failing inputs are written to `target/fuzz-findings/`.

mod common;

use candle_core::{DType, Device};
use common::fixture;
use metal_candle::engine::model::chat_template::{ChatMessage, ChatTemplate};
use metal_candle::engine::model::load_model;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// xorshift64*: small, fast, reproducible from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

fn seconds() -> u64 {
    std::env::var("FUZZ_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(10)
}

fn seed() -> u64 {
    std::env::var("FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1
    })
}

/// Panics seen by the hook, caught or not.
static PANICS: AtomicUsize = AtomicUsize::new(0);

fn count_panics() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            previous(info);
        }));
    });
}

fn save_finding(target: &str, iteration: u64, bytes: &[u8]) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/fuzz-findings");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{target}-{iteration}.bin"));
    std::fs::write(&path, bytes).unwrap();
    path
}

const INTERESTING: [u64; 14] =
    [0, 1, 2, 4, 8, 32, 255, 0x7fff_ffff, 0xffff_ffff, 1 << 32, 1 << 40, u64::MAX, u64::MAX / 2, 1_000_000_007];

/// One random edit of `bytes`, mostly inside `hot` (the header, where the parser's decisions are).
fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>, hot: usize) {
    let len = bytes.len().max(1);
    let at = if rng.below(10) < 8 { rng.below(hot.min(len)) } else { rng.below(len) };
    match rng.below(7) {
        0 if !bytes.is_empty() => {
            let i = at.min(bytes.len() - 1);
            bytes[i] ^= 1 << rng.below(8);
        }
        1 if !bytes.is_empty() => {
            let i = at.min(bytes.len() - 1);
            bytes[i] = *rng.pick(&[0u8, 1, 0x7f, 0x80, 0xff]);
        }
        2 => {
            let value = if rng.below(4) == 0 { len as u64 + rng.below(3) as u64 - 1 } else { *rng.pick(&INTERESTING) };
            let width = *rng.pick(&[4usize, 8]);
            if at + width <= bytes.len() {
                bytes[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]);
            }
        }
        3 => bytes.truncate(at),
        4 => {
            let end = (at + rng.below(64) + 1).min(bytes.len());
            bytes.drain(at.min(end)..end);
        }
        5 => {
            let end = (at + rng.below(64) + 1).min(bytes.len());
            let chunk = bytes[at.min(end)..end].to_vec();
            let to = rng.below(hot.min(bytes.len()) + 1);
            bytes.splice(to..to, chunk);
        }
        _ => {
            let value = *rng.pick(&INTERESTING);
            if at + 8 <= bytes.len() {
                bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
            }
        }
    }
}

/// Run `target` on inputs made by `make` for the configured time; fail on an escaped panic or a slow input.
fn fuzz(name: &str, mut make: impl FnMut(&mut Rng) -> Vec<u8>, mut target: impl FnMut(&[u8]) -> bool) {
    count_panics();
    let (secs, seed) = (seconds(), seed());
    eprintln!("fuzz {name}: {secs} s, FUZZ_SEED={seed}");
    let mut rng = Rng(seed);
    let started = Instant::now();
    let (mut runs, mut accepted, mut escaped, mut slowest) = (0u64, 0u64, Vec::new(), Duration::ZERO);
    let panics_before = PANICS.load(Ordering::SeqCst);
    while started.elapsed() < Duration::from_secs(secs) {
        let input = make(&mut rng);
        let one = Instant::now();
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| target(&input))) {
            Ok(true) => accepted += 1,
            Ok(false) => {}
            Err(_) => escaped.push(save_finding(name, runs, &input)),
        }
        let took = one.elapsed();
        if took > Duration::from_secs(20) {
            panic!("{name}: input {runs} took {took:?}; saved as {}", save_finding(name, runs, &input).display());
        }
        slowest = slowest.max(took);
        runs += 1;
    }
    // Counted process-wide: targets running beside this one add theirs.
    let caught = PANICS.load(Ordering::SeqCst).saturating_sub(panics_before + escaped.len());
    eprintln!(
        "fuzz {name}: {runs} inputs in {:.0} s, {accepted} accepted, {} escaped panics, {caught} panics caught \
         inside the engine (any target), slowest {slowest:?}",
        started.elapsed().as_secs_f64(),
        escaped.len()
    );
    assert!(escaped.is_empty(), "{name}: inputs that panicked: {escaped:?}");
}

fn model_loads(path: &Path) -> bool {
    load_model(path, &Device::Cpu, DType::F32).is_ok()
}

#[test]
fn fuzz_safetensors_header() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("model");
    std::fs::create_dir(&folder).unwrap();
    for entry in std::fs::read_dir(fixture("tiny-llama")).unwrap().flatten() {
        std::fs::copy(entry.path(), folder.join(entry.file_name())).unwrap();
    }
    let original = std::fs::read(folder.join("model.safetensors")).unwrap();
    let header_len = u64::from_le_bytes(original[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(original[8..8 + header_len].to_vec()).unwrap();
    let data = original[8 + header_len..].to_vec();
    let words =
        ["F32", "F16", "BF16", "U8", "I64", "U32", "F64", "BOOL", "\"shape\"", "\"data_offsets\"", "__metadata__"];
    let make = |rng: &mut Rng| {
        if rng.below(2) == 0 {
            // Structural: edit the header's text (numbers, dtypes, names), keep the length prefix right.
            let mut text = header.clone();
            for _ in 0..rng.below(3) + 1 {
                let at = rng.below(text.len());
                let at = (0..=at).rev().find(|i| text.is_char_boundary(*i)).unwrap_or(0);
                let end = text[at..].find([',', ']', '}']).map(|e| at + e).unwrap_or(text.len());
                let replacement = match rng.below(3) {
                    0 => rng.pick(&INTERESTING).to_string(),
                    1 => format!("\"{}\"", rng.pick(&words).trim_matches('"')),
                    _ => text[rng.below(text.len() / 2)..][..8.min(text.len() / 2)].to_string(),
                };
                if text.is_char_boundary(end) {
                    text.replace_range(at..end, &replacement);
                }
            }
            let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
            bytes.extend_from_slice(text.as_bytes());
            bytes.extend_from_slice(&data);
            bytes
        } else {
            let mut bytes = original.clone();
            for _ in 0..rng.below(4) + 1 {
                mutate(rng, &mut bytes, 8 + header_len);
            }
            bytes
        }
    };
    let target = folder.join("model.safetensors");
    fuzz("safetensors", make, |bytes| {
        std::fs::write(&target, bytes).unwrap();
        model_loads(&folder)
    });
}

#[test]
fn fuzz_gguf_reader() {
    let dir = tempfile::tempdir().unwrap();
    let seeds: Vec<Vec<u8>> =
        ["tiny-mistral-f32.gguf", "tiny-qwen3-f16.gguf", "tiny-gemma3-f32.gguf", "tiny-phi3-f32.gguf"]
            .iter()
            .map(|n| std::fs::read(fixture("gguf").join(n)).unwrap())
            .collect();
    // The metadata and tensor table end well before the data; the first 64 KB hold them in these fixtures.
    let make = |rng: &mut Rng| {
        let mut bytes = rng.pick(&seeds).clone();
        for _ in 0..rng.below(4) + 1 {
            mutate(rng, &mut bytes, 64 << 10);
        }
        bytes
    };
    let target = dir.path().join("model.gguf");
    fuzz("gguf", make, |bytes| {
        std::fs::write(&target, bytes).unwrap();
        model_loads(&target)
    });
}

#[test]
fn fuzz_chat_template_renderer() {
    let mut seeds: Vec<String> =
        ["tiny-llama", "tiny-gemma3", "tiny-granite", "tiny-phi3", "tiny-qwen3", "tiny-smollm3"]
            .iter()
            .filter_map(|n| {
                let config: serde_json::Value =
                    serde_json::from_str(&std::fs::read_to_string(fixture(n).join("tokenizer_config.json")).ok()?)
                        .ok()?;
                config.get("chat_template")?.as_str().map(str::to_string)
            })
            .collect();
    seeds.push("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}".into());
    let snippets = [
        "{% for i in range(100000) %}",
        "{% endfor %}",
        "{% set ns = namespace(s='ab') %}",
        "{% set ns.s = ns.s ~ ns.s %}",
        "{{ 'x' * 100000000 }}",
        "{{ ' ' | indent(100000000000) }}",
        "{{ messages | tojson }}",
        "{{ strftime_now('%Y' * 1000) }}",
        "{{ raise_exception('no') }}",
        "{% macro m(x) %}{{ m(x) }}{% endmacro %}{{ m(1) }}",
        "{{ messages[0]['content'].split('') }}",
        "{{ '%999999999d' | format(1) }}",
        "{{ range(99999999) | list }}",
        "{{ (messages * 100000) | length }}",
        "{% if ",
        "{{ ",
        " }}",
        "%}",
        "{{ loop.",
        "{{ messages[-1] }}",
        "{{ 1 / 0 }}",
        "{% include 'chat' %}",
        "{{ tools }}",
    ];
    let make = |rng: &mut Rng| {
        let mut text = rng.pick(&seeds).clone();
        for _ in 0..rng.below(3) + 1 {
            let at = rng.below(text.len() + 1);
            let at = (0..=at).rev().find(|i| text.is_char_boundary(*i)).unwrap_or(0);
            match rng.below(3) {
                0 => text.insert_str(at, *rng.pick(&snippets)),
                1 => {
                    let end = (at + rng.below(40)).min(text.len());
                    if text.is_char_boundary(end) {
                        text.replace_range(at..end, "");
                    }
                }
                _ => text.insert_str(at, &format!("{}{}", rng.pick(&snippets), rng.pick(&snippets))),
            }
        }
        text.into_bytes()
    };
    let messages = [
        ChatMessage::new("system", "be brief"),
        ChatMessage::new("user", "hi"),
        ChatMessage::new("assistant", "hello"),
        ChatMessage::new("user", "what is 2+2?"),
    ];
    fuzz("template", make, |bytes| {
        let Ok(source) = String::from_utf8(bytes.to_vec()) else { return false };
        let Ok(template) = ChatTemplate::new(source, Some("<s>".into()), Some("</s>".into())) else { return false };
        // A small budget: every render that goes over parks a thread holding up to it.
        let template = template.with_memory_budget(8 << 20);
        template.render(&messages, true).is_ok()
    });
}
