//! `metal-candle hub`: search the Hugging Face Hub, download repositories into the cache `huggingface_hub`
//! shares, and store a token where it keeps one. Also the CLI's one place that turns a `--model` / `--data`
//! value into a local path: a path that exists wins, a repo id is read from the cache or downloaded, with an
//! updating progress line on stderr. Ctrl-C cancels a download; what arrived is kept and resumes next time.

use crate::engine::hub::{self, DownloadProgress, HubClient, HubSettings, RepoKind, RepoSpec, Resolved};
use anyhow::Context;
use clap::{Args, Subcommand};
use std::io::IsTerminal;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(Debug, Subcommand)]
pub enum HubCommand {
    /// Find models (or datasets) by text: downloads, likes, license, gated, size, supported architecture, GGUF files.
    Search(SearchArgs),
    /// Download a repository (or the files --include names) into the Hugging Face cache; prints the snapshot
    /// folder as the last line.
    Download(DownloadArgs),
    /// Store a Hugging Face token where `huggingface_hub` keeps it (read from --token or standard input).
    Login(LoginArgs),
    /// Remove the stored token.
    Logout,
}

#[derive(Debug, Args)]
pub struct SearchArgs {
    pub query: String,
    /// Search datasets instead of models.
    #[arg(long)]
    pub dataset: bool,
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct DownloadArgs {
    /// ORG/NAME: every file of the repository, as `hf download` does (free disk space is checked first);
    /// `ORG/NAME:QUANT` takes one file of a GGUF repo (e.g. `:Q4_K_M`), --include narrows by glob.
    pub repo: String,
    /// A dataset repository.
    #[arg(long)]
    pub dataset: bool,
    /// Branch, tag or commit (default: main).
    #[arg(long)]
    pub revision: Option<String>,
    /// Only files matching this glob (repeatable; `*` crosses folders, `dir/` means a folder).
    #[arg(long = "include")]
    pub include: Vec<String>,
    /// Print the snapshot as JSON (folder, commit, files, bytes) instead of the folder alone.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct LoginArgs {
    /// The token (else one line is read from standard input, so it stays out of the shell history).
    #[arg(long)]
    pub token: Option<String>,
}

/// The Hub settings of this process's environment (HF_ENDPOINT, HF_HOME, HF_HUB_CACHE, HF_TOKEN, ...).
pub fn settings() -> HubSettings {
    HubSettings::from_env(|name| std::env::var(name).ok())
}

pub fn run(command: HubCommand) -> anyhow::Result<()> {
    match command {
        HubCommand::Search(a) => search(&a),
        HubCommand::Download(a) => download(&a),
        HubCommand::Login(a) => login(&a),
        HubCommand::Logout => logout(),
    }
}

fn kind_of(dataset: bool) -> RepoKind {
    if dataset {
        RepoKind::Dataset
    } else {
        RepoKind::Model
    }
}

fn search(args: &SearchArgs) -> anyhow::Result<()> {
    let client = HubClient::new(settings());
    let hits = hub::search(&client, kind_of(args.dataset), &args.query, args.limit, &AtomicBool::new(false))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&hits)?);
        return Ok(());
    }
    println!(
        "{:<52} {:>10} {:>6} {:<12} {:>10}  {:<14} notes",
        "id", "downloads", "likes", "license", "size", "architecture"
    );
    for h in &hits {
        let size = h.size_bytes.map_or("-".into(), |b| format!("{:.1} MiB", b as f64 / 1048576.0));
        let arch = h.architecture.as_deref().unwrap_or("-");
        let mut notes = Vec::new();
        match h.supported {
            Some(true) => {}
            Some(false) => notes.push("not supported".to_string()),
            None => notes.push("architecture unknown".to_string()),
        }
        if h.gated {
            notes.push("gated".into());
        }
        if !h.gguf_files.is_empty() {
            let quants: Vec<&str> = h
                .gguf_files
                .iter()
                .map(|g| if g.quant.is_empty() { g.file.as_str() } else { g.quant.as_str() })
                .collect();
            notes.push(format!("GGUF: {}", quants.join(" ")));
        }
        let license = h.license.as_deref().unwrap_or("-");
        println!(
            "{:<52} {:>10} {:>6} {license:<12} {size:>10}  {arch:<14} {}",
            h.id,
            h.downloads,
            h.likes,
            notes.join("; ")
        );
    }
    if hits.is_empty() {
        println!("(nothing matches `{}`)", args.query);
    }
    Ok(())
}

/// A cancel flag Ctrl-C / SIGTERM sets.
fn cancel_on_signal() -> Arc<AtomicBool> {
    let cancel = Arc::new(AtomicBool::new(false));
    if crate::stop_signals::install() {
        let flag = cancel.clone();
        crate::stop_signals::forward(move || flag.store(true, Ordering::SeqCst));
    }
    cancel
}

/// One updating stderr line for a terminal, about ten times a second.
fn progress_printer() -> impl FnMut(&DownloadProgress) {
    let terminal = std::io::stderr().is_terminal();
    let mut last = std::time::Instant::now() - std::time::Duration::from_secs(1);
    let mut shown = false;
    move |p: &DownloadProgress| {
        let finished = p.files_done == p.file_count;
        if !terminal || (!finished && last.elapsed().as_millis() < 100) {
            return;
        }
        last = std::time::Instant::now();
        if finished && !shown {
            return; // everything was already cached: nothing to show
        }
        shown = true;
        eprint!("\r{}\x1b[K", describe(p));
        if finished {
            eprintln!();
        }
    }
}

/// "3/7 model.safetensors 120.5 of 269.1 MiB, 45.2 MiB/s, 3 s left".
pub fn describe(p: &DownloadProgress) -> String {
    let mib = |b: u64| b as f64 / 1048576.0;
    let left = p.secs_left.map_or(String::new(), |s| format!(", {s:.0} s left"));
    format!(
        "downloading {} {}/{} {} {:.1} of {:.1} MiB, {:.1} MiB/s{left}",
        p.repo,
        (p.files_done + 1).min(p.file_count),
        p.file_count,
        p.file,
        mib(p.bytes_done),
        mib(p.bytes_total),
        p.bytes_per_sec / 1048576.0
    )
}

fn download(args: &DownloadArgs) -> anyhow::Result<()> {
    let client = HubClient::new(settings());
    let cancel = cancel_on_signal();
    let mut spec = RepoSpec::parse(&args.repo)?;
    if args.revision.is_some() {
        spec.revision = args.revision.clone();
    }
    let kind = kind_of(args.dataset);
    let mut printer = progress_printer();
    let result = if spec.quant.is_some() {
        // One file of a GGUF repository, chosen as `--model ORG/NAME:QUANT` chooses it.
        let text = format!("{}@{}:{}", spec.repo, spec.revision(), spec.quant.as_deref().unwrap_or_default());
        hub::resolve(&client, &text, RepoKind::Model, &args.include, &mut printer, &cancel).map(|r| {
            let path = r.path.parent().map(Path::to_path_buf).unwrap_or(r.path.clone());
            serde_json::json!({ "path": path, "file": r.path, "commit": r.origin.map(|o| o.commit) })
        })
    } else {
        let request = hub::SnapshotRequest {
            kind,
            repo: spec.repo.clone(),
            revision: spec.revision().to_string(),
            include: args.include.clone(),
        };
        hub::download_snapshot(&client, &request, &|_| true, &mut printer, &cancel).map(|s| {
            if let Some(note) = &s.cache_note {
                eprintln!("note: {note}");
            }
            serde_json::to_value(&s).unwrap_or_default()
        })
    };
    let value = result.map_err(|e| cancelled_note(e.into()))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        println!("{}", value["path"].as_str().unwrap_or_default());
    }
    Ok(())
}

fn cancelled_note(e: anyhow::Error) -> anyhow::Error {
    match e.downcast_ref::<crate::engine::Error>() {
        Some(crate::engine::Error::Cancelled) => {
            anyhow::anyhow!("download cancelled; what arrived is kept in the cache and the next download resumes it")
        }
        _ => e,
    }
}

fn login(args: &LoginArgs) -> anyhow::Result<()> {
    let text = match &args.token {
        Some(t) => t.clone(),
        None => {
            if std::io::stdin().is_terminal() {
                eprint!("Hugging Face token (https://huggingface.co/settings/tokens): ");
            }
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).context("reading the token from standard input")?;
            line
        }
    };
    let token = hub::Token::new(&text).ok_or_else(|| anyhow::anyhow!("the token is empty"))?;
    let path = settings().token_path;
    hub::save_token(&path, &token)?;
    eprintln!("token saved to {} (huggingface_hub reads it too)", path.display());
    Ok(())
}

fn logout() -> anyhow::Result<()> {
    let path = settings().token_path;
    match std::fs::remove_file(&path) {
        Ok(()) => eprintln!("removed {}", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => eprintln!("no token stored at {}", path.display()),
        Err(e) => return Err(e).with_context(|| format!("removing {}", path.display())),
    }
    if std::env::var_os("HF_TOKEN").is_some() {
        eprintln!("note: HF_TOKEN is still set in this environment");
    }
    Ok(())
}

/// `--model` or `--data` as a local path: the path itself when it exists, else the repo id resolved from the
/// cache (downloading what is missing, with progress on stderr).
pub fn resolve_path(spec: &Path, kind: RepoKind) -> anyhow::Result<Resolved> {
    let text = spec.to_string_lossy();
    if spec.exists() || !hub::looks_like_repo_id(&text) {
        return Ok(Resolved { path: spec.to_path_buf(), origin: None, cache_note: None });
    }
    let client = HubClient::new(settings());
    let cancel = cancel_on_signal();
    let resolved = hub::resolve(&client, &text, kind, &[], &mut progress_printer(), &cancel)
        .map_err(|e| cancelled_note(e.into()))?;
    if let Some(note) = &resolved.cache_note {
        eprintln!("note: {note}");
    }
    Ok(resolved)
}
