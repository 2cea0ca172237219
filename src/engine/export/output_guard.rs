//! Where an export may write, checked before any work: never onto its own inputs (the base model, the
//! checkpoint, a run folder's own files or checkpoints) and never over an existing output unless asked
//! (`--overwrite`, the studio's "Replace"). A run's `exports/` subfolder (the studio's default) is allowed: it
//! holds nothing a run or a resume reads.

use super::ExportRequest;
use crate::engine::checkpoint::TRAINER_STATE;
use crate::engine::train::run_folder::{METRICS, RUN_CONFIG};
use crate::engine::train::run_lock::RUN_LOCK;
use crate::engine::{Error, Result};
use std::path::{Component, Path, PathBuf};

/// `path` made absolute and free of `.`/`..` and symlinks as far as it exists (the rest appended as written).
pub fn resolved(path: &Path) -> PathBuf {
    let absolute =
        if path.is_absolute() { path.to_path_buf() } else { std::env::current_dir().unwrap_or_default().join(path) };
    let mut existing = absolute.clone();
    let mut rest = Vec::new();
    while !existing.exists() {
        match (existing.file_name().map(|n| n.to_os_string()), existing.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name);
                existing = parent.to_path_buf();
            }
            _ => break,
        }
    }
    let mut out = std::fs::canonicalize(&existing).unwrap_or(existing);
    for name in rest.into_iter().rev() {
        out.push(name);
    }
    // `..` in the part that does not exist yet.
    let mut clean = PathBuf::new();
    for c in out.components() {
        match c {
            Component::ParentDir => {
                clean.pop();
            }
            Component::CurDir => {}
            other => clean.push(other),
        }
    }
    clean
}

fn refuse(out: &Path, why: String) -> Error {
    Error::InvalidSetting(format!("cannot export to {}: {why}; pick another --out", out.display()))
}

/// Refuse an output that lands on the export's inputs or on a run, or replaces something without `req.overwrite`.
pub fn check_output(req: &ExportRequest) -> Result<()> {
    let out = resolved(&req.out);
    let base = resolved(&req.base_model);
    if out == base || (base.is_dir() && out.starts_with(&base)) {
        return Err(refuse(&req.out, format!("it is, or is inside, the base model {}", req.base_model.display())));
    }
    if let Some(ckpt) = &req.checkpoint {
        if out.starts_with(resolved(ckpt)) {
            return Err(refuse(&req.out, format!("it is, or is inside, the checkpoint {}", ckpt.display())));
        }
    }
    for dir in out.ancestors() {
        if dir.join(TRAINER_STATE).is_file() {
            return Err(refuse(&req.out, format!("it is, or is inside, the checkpoint {}", dir.display())));
        }
        if dir.join(RUN_CONFIG).is_file() {
            let first = out.strip_prefix(dir).ok().and_then(|rel| rel.components().next());
            let first = first.map(|c| c.as_os_str().to_string_lossy().into_owned());
            let run_file = match first.as_deref() {
                None => true,
                Some(name) => {
                    [RUN_CONFIG, METRICS, RUN_LOCK].contains(&name)
                        || name.starts_with("checkpoint-")
                        || name.starts_with(".checkpoint-")
                }
            };
            if run_file {
                return Err(refuse(
                    &req.out,
                    format!("it is the run folder {} or one of its own files or checkpoints (its exports/ subfolder is free)", dir.display()),
                ));
            }
        }
    }
    if !req.overwrite {
        let occupied = match std::fs::symlink_metadata(&req.out) {
            Ok(m) if m.is_dir() => std::fs::read_dir(&req.out).map(|mut d| d.next().is_some()).unwrap_or(true),
            Ok(_) => true,
            Err(_) => false,
        };
        if occupied {
            return Err(Error::InvalidSetting(format!(
                "{} already exists; pass --overwrite to replace it (in the studio: tick \"Replace\"), or pick another --out",
                req.out.display()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::export::{ExportFormat, GgufQuant};

    fn request(out: PathBuf, base: PathBuf, ckpt: Option<PathBuf>) -> ExportRequest {
        ExportRequest {
            checkpoint: ckpt,
            format: ExportFormat::Peft,
            quant: GgufQuant::default(),
            out,
            base_model: base,
            allow_other_base: false,
            overwrite: false,
        }
    }

    #[test]
    fn outputs_on_inputs_or_runs_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base");
        let run = dir.path().join("runs/r");
        let ckpt = run.join("checkpoint-2");
        for d in [&base, &ckpt, &run.join("checkpoint-4")] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(base.join("config.json"), "{}").unwrap();
        std::fs::write(run.join(RUN_CONFIG), "{}").unwrap();
        std::fs::write(ckpt.join(TRAINER_STATE), "{}").unwrap();
        let check = |out: PathBuf| check_output(&request(out, base.clone(), Some(ckpt.clone())));
        for out in [
            base.clone(),
            base.join("merged"),
            ckpt.clone(),
            run.join("checkpoint-4"),
            run.clone(),
            run.join("run.json"),
            dir.path().join("runs/r/../r/checkpoint-2/x"),
        ] {
            assert!(check(out.clone()).is_err(), "{} was allowed", out.display());
        }
        assert!(check(run.join("exports/checkpoint-2-peft")).is_ok());
        assert!(check(dir.path().join("elsewhere/adapter")).is_ok());
        std::fs::create_dir_all(dir.path().join("full")).unwrap();
        std::fs::write(dir.path().join("full/x"), "x").unwrap();
        let err = check(dir.path().join("full")).unwrap_err().to_string();
        assert!(err.contains("already exists; pass --overwrite"), "{err}");
        let replace = ExportRequest { overwrite: true, ..request(dir.path().join("full"), base.clone(), Some(ckpt)) };
        assert!(check_output(&replace).is_ok());
    }
}
