//! The op recorder: runs metal-candle's own CLI in this process with `--kernels portable` (the graph a Mac runs)
//! against a recording copy of candle-core (`patch_candle.py`), and writes every Candle op each command ran, as
//! the backend received it: the op, its dtypes, and whether each input is contiguous, scalar-like or strided.
//!
//! One JSON line per command: `{"case", "dtype", "ok", "error", "ops", "wgsl_launches", "records": [{op, dtypes,
//! layouts, count}]}`. `ops` is the number of backend operations (what Metal dispatches one by one); `records` the
//! distinct ones. A last line per family and dtype, `{"ops_per_step", "wgsl_launches_per_step", ...}`, is what one
//! SFT step of batch 2 x 128 tokens runs (the difference between a 3-step and a 2-step run).
//!
//!     cargo run --release --manifest-path tools/op-recorder/Cargo.toml -- --dtype f32,bf16,f16 --out FILE
//!
//! Built with `--features wgsl`, `--kernels wgsl` runs the commands on the portable graph with our WGSL kernels (on
//! this machine through Vulkan): a Mac then dispatches the recorded Candle ops plus the WGSL launches, counted apart.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Parser;

#[derive(Parser)]
struct Args {
    /// The model dtypes to run every case in.
    #[arg(long, value_delimiter = ',', default_value = "f32,bf16,f16")]
    dtype: Vec<String>,
    /// Families (tests/fixtures/tiny-<family>).
    #[arg(long, value_delimiter = ',', default_value = "llama,mistral,qwen2,qwen3,gemma3,phi3,smollm3,granite,olmo2")]
    families: Vec<String>,
    /// Only the cases whose label contains one of these (default: all).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Also run one op Candle's Metal backend lacks (a bf16 -> f64 cast), to prove the check fails on it.
    #[arg(long)]
    deliberate_unsupported: bool,
    /// Where the JSON lines go.
    #[arg(long)]
    out: PathBuf,
    /// The kernel set every command runs with: portable, or wgsl (a build with `--features wgsl`).
    #[arg(long, default_value = "portable")]
    kernels: String,
}

/// The training flags every training case shares: a few short steps on the CPU, the portable graph (`--kernels`
/// is added by [`cases`]). A flag in `extra` replaces the default of the same name.
fn train(model: &Path, data: &str, out: &Path, dtype: &str, seq_len: &str, extra: &[&str]) -> Vec<String> {
    let (model, out) = (model.to_string_lossy(), out.to_string_lossy());
    let defaults: [(&str, &str); 14] = [
        ("--model", &model),
        ("--data", data),
        ("--out", &out),
        ("--name", "rec"),
        ("--iters", "2"),
        ("--batch-size", "2"),
        ("--seq-len", seq_len),
        ("--rank", "4"),
        ("--targets", "all-linear"),
        ("--dropout", "0.1"),
        ("--save-every", "0"),
        ("--val-every", "0"),
        ("--device", "cpu"),
        ("--dtype", dtype),
    ];
    let mut a = vec!["train".to_string()];
    for (flag, value) in defaults {
        if !extra.contains(&flag) {
            a.extend([flag.to_string(), value.to_string()]);
        }
    }
    a.push("--json".to_string());
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// (label, argv) for one family in one dtype, each run with `kernels`. The "sft" case saves a checkpoint at its
/// end, which the export and generation cases after it read (generation decodes through the KV cache with that
/// adapter on).
fn cases(root: &Path, family: &str, dtype: &str, work: &Path, kernels: &str) -> Vec<(String, Vec<String>)> {
    let model = root.join(format!("tests/fixtures/tiny-{family}"));
    let m = model.to_string_lossy().to_string();
    let run = work.join(format!("{family}-{dtype}"));
    // Rows without a chat template (the tiny smollm3 and granite templates' system prompts alone outgrow the
    // fixtures' 256 positions): plain text, and TRL's standard (untemplated) preference and prompt rows.
    let chat = root.join("tests/fixtures/datasets/text.parquet");
    let pref = root.join("tests/fixtures/preference/rows-standard.jsonl");
    let grpo = root.join("tests/fixtures/grpo-prompts/rows-standard.jsonl");
    let (chat, pref, grpo) = (chat.to_string_lossy(), pref.to_string_lossy(), grpo.to_string_lossy());
    let on_cpu = ["--device", "cpu", "--dtype", dtype];
    let mut c = vec![
        ("sft".to_string(), train(&model, &chat, &run.join("sft"), dtype, "128", &[])),
        // One step more than "sft": the difference is what one training step runs (ops_per_step in the output).
        ("sft-3-steps".into(), train(&model, &chat, &run.join("sft3"), dtype, "128", &["--iters", "3"])),
        ("sft-checkpointing".into(), train(&model, &chat, &run.join("ckpt"), dtype, "128", &["--checkpointing", "on"])),
        ("dora".into(), train(&model, &chat, &run.join("dora"), dtype, "128", &["--dora"])),
        ("sft-packing".into(), train(&model, &chat, &run.join("pack"), dtype, "128", &["--packing"])),
        ("q4k".into(), train(&model, &chat, &run.join("q4k"), dtype, "128", &["--quantize", "q4k"])),
        ("dpo".into(), train(&model, &pref, &run.join("dpo"), dtype, "128", &["--method", "dpo"])),
        ("orpo".into(), train(&model, &pref, &run.join("orpo"), dtype, "128", &["--method", "orpo"])),
        (
            "grpo".into(),
            train(
                &model,
                &grpo,
                &run.join("grpo"),
                dtype,
                "128",
                &["--method", "grpo", "--num-generations", "2", "--max-new-tokens", "4", "--beta", "0.04"],
            ),
        ),
    ];
    // The merged export of the "sft" case's checkpoint (a merge on the CPU on every machine, portable kernels).
    let mut export = strings(&["export", "--format", "merged", "--model", &m, "--checkpoint"]);
    export.push(run.join("sft/rec/checkpoint-2").to_string_lossy().to_string());
    export.push("--out".into());
    export.push(run.join("merged").to_string_lossy().to_string());
    c.push(("export-merged".into(), export));
    // A base kept in its GGUF blocks (`--quantize keep`): the real SmolLM2 Q4_1 (a llama), once per dtype.
    if family == "llama" {
        let smollm2 = root.join("models/smollm2/SmolLM2-135M-Instruct-Q4_1.gguf");
        let keep = ["--quantize", "keep", "--targets", "q_proj,v_proj", "--batch-size", "1"];
        c.push(("keep-q4_1".into(), train(&smollm2, &chat, &run.join("keep"), dtype, "32", &keep)));
    }
    let mut generate =
        strings(&["generate", "--model", &m, "--prompt", "Hello there", "--max-tokens", "6", "--temperature", "0"]);
    generate.extend(strings(&on_cpu));
    generate.push("--adapter".into());
    generate.push(run.join("sft/rec/checkpoint-2").to_string_lossy().to_string());
    c.push(("generate".into(), generate));
    let mut mc = strings(&["eval", "--model", &m, "--task", "multiple-choice", "--data"]);
    mc.push(root.join("assets/sample-mc/test.jsonl").to_string_lossy().to_string());
    mc.extend(strings(&["--limit", "4"]));
    mc.extend(strings(&on_cpu));
    c.push(("score-multiple-choice".into(), mc));
    for (_, argv) in &mut c {
        argv.extend(strings(&["--kernels", kernels]));
    }
    c
}

/// WGSL launches this process has made, all entry points together.
fn wgsl_launches() -> usize {
    metal_candle::engine::ops::metal::launch_counts().values().sum()
}

fn main() {
    let args = Args::parse();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap();
    let work = std::env::temp_dir().join(format!("op-recorder-{}", std::process::id()));
    let mut out = std::fs::File::create(&args.out).expect("cannot write --out");
    for dtype in &args.dtype {
        for family in &args.families {
            let mut sft_ops: BTreeMap<String, (usize, usize)> = BTreeMap::new();
            for (label, argv) in cases(&root, family, dtype, &work, &args.kernels) {
                let case = format!("{family}/{label}");
                if !args.only.is_empty() && !args.only.iter().any(|o| case.contains(o.as_str())) {
                    continue;
                }
                let mut full = vec!["metal-candle".to_string()];
                full.extend(argv);
                let launches_before = wgsl_launches();
                candle_core::op_record::start();
                let result = metal_candle::cli::Cli::try_parse_from(&full)
                    .map_err(|e| e.to_string())
                    .and_then(|cli| metal_candle::cli::run(cli).map_err(|e| format!("{e:#}")));
                let records = candle_core::op_record::take();
                let launches = wgsl_launches() - launches_before;
                let mut distinct: BTreeMap<_, usize> = BTreeMap::new();
                for r in &records {
                    *distinct.entry((r.op.clone(), r.dtypes.clone(), r.layouts.clone())).or_default() += 1;
                }
                let line = serde_json::json!({
                    "case": case, "dtype": dtype, "ok": result.is_ok(), "error": result.err(),
                    "ops": records.len(), "wgsl_launches": launches,
                    "records": distinct.iter().map(|((op, dtypes, layouts), n)| serde_json::json!({
                        "op": op, "dtypes": dtypes, "layouts": layouts, "count": n })).collect::<Vec<_>>(),
                });
                writeln!(out, "{line}").unwrap();
                let (ops, kinds) = (records.len(), distinct.len());
                eprintln!("{case} {dtype}: {ops} ops, {kinds} distinct, {launches} WGSL launches");
                sft_ops.insert(label, (records.len(), launches));
            }
            if let (Some(two), Some(three)) = (sft_ops.get("sft"), sft_ops.get("sft-3-steps")) {
                let per_step = serde_json::json!({"ops_per_step": three.0.saturating_sub(two.0),
                    "wgsl_launches_per_step": three.1.saturating_sub(two.1), "family": family,
                    "dtype": dtype, "batch": 2, "seq_len": 128, "kernels": args.kernels});
                writeln!(out, "{per_step}").unwrap();
            }
        }
    }
    if args.deliberate_unsupported {
        candle_core::op_record::start();
        let cast = candle_core::Tensor::ones((2, 2), candle_core::DType::BF16, &candle_core::Device::Cpu)
            .and_then(|t| t.to_dtype(candle_core::DType::F64));
        let records = candle_core::op_record::take();
        let line = serde_json::json!({
            "case": "deliberate-unsupported", "dtype": "bf16", "ok": cast.is_ok(), "error": null, "ops": records.len(),
            "records": records.iter().map(|r| serde_json::json!({
                "op": r.op, "dtypes": r.dtypes, "layouts": r.layouts, "count": 1 })).collect::<Vec<_>>(),
        });
        writeln!(out, "{line}").unwrap();
    }
    let _ = std::fs::remove_dir_all(&work);
}
