//! A data-parallel run started from the studio (its GPU count above one): the same binary started once per GPU as
//! the CLI's `train --gpus` starts it (engine/distributed/launch.rs), with the studio's settings in a TOML file. The
//! leader's JSON events stream back into the studio like an in-process run's; stop, pause and resume reach the
//! leader as lines on its standard input, and it passes a stop to the other ranks with the next step's gradients.

use super::jobs::RunOutlet;
use super::Outbox;
use crate::engine::distributed::launch::{self, LeaderOutput};
use crate::engine::model::LoadedModel;
use crate::engine::train::{ModelLimits, TrainConfig, TrainControl, TrainEvent};
use crate::engine::{Error, Result};
use std::io::BufRead;
use std::path::{Path, PathBuf};

/// Run `config` on `gpus` processes of `program` (this binary), forwarding the leader's events. The settings are
/// checked against the loaded `base` first (the engine's one check, as `train_job` runs it), before any process
/// starts.
pub(super) fn data_parallel_job(
    config: &TrainConfig,
    base: &LoadedModel,
    (gpus, program): (usize, &Path),
    control: &TrainControl,
    out: &Outbox,
    on_final: impl FnOnce(),
) {
    let mut outlet = RunOutlet::new(out, control, on_final);
    if let Err(e) = config.validate_for_model(ModelLimits::of(&base.config)) {
        return outlet.end(Err(e));
    }
    let settings = settings_file();
    let result = run(config, gpus, program, &settings, control, &mut outlet);
    let _ = std::fs::remove_file(&settings);
    outlet.end(result);
}

/// A file for the run's settings, unique to this studio and run.
fn settings_file() -> PathBuf {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    std::env::temp_dir().join(format!("metal-candle-run-{}-{nanos}.toml", std::process::id()))
}

fn run<F: FnOnce()>(
    config: &TrainConfig,
    gpus: usize,
    program: &Path,
    settings: &Path,
    control: &TrainControl,
    outlet: &mut RunOutlet<'_, F>,
) -> Result<()> {
    crate::engine::train::require_data_parallel_method(config)?;
    config.write_toml_file(settings)?;
    let args: Vec<std::ffi::OsString> =
        ["train".into(), "--config".into(), settings.as_os_str().to_owned(), "--json".into(), "--control-stdin".into()]
            .into();
    let mut ranks = launch::start(program, &args, gpus, LeaderOutput::Piped)?;
    let stdout = ranks.take_leader_stdout().ok_or_else(|| Error::Distributed("rank 0's output is not piped".into()))?;
    let (tx, events) = crossbeam_channel::unbounded();
    let reader = std::thread::Builder::new()
        .name("mc-rank0-events".into())
        .spawn(move || {
            for line in std::io::BufReader::new(stdout).lines().map_while(std::result::Result::ok) {
                if let Ok(event) = serde_json::from_str::<TrainEvent>(&line) {
                    if tx.send(event).is_err() {
                        return;
                    }
                }
            }
        })
        .map_err(|e| Error::Distributed(format!("cannot read rank 0's events: {e}")))?;
    let (mut stop_sent, mut paused_sent) = (false, false);
    // Rank 0's failure waits for the launcher's verdict: when another rank died first, rank 0 only saw it go, and the
    // launcher's message (that rank's own last lines) says why.
    let mut leader_failed: Option<TrainEvent> = None;
    let mut forward = |event: TrainEvent, outlet: &mut RunOutlet<'_, F>| match event {
        TrainEvent::Failed { .. } => leader_failed = Some(event),
        other => outlet.emit(other),
    };
    let waited = ranks.wait(&mut |ranks| {
        for event in events.try_iter() {
            forward(event, outlet);
        }
        if control.stop_requested() && !stop_sent {
            // A paused run stops too (the studio's Stop un-pauses an in-process run the same way).
            stop_sent = ranks.tell_leader("resume") && ranks.tell_leader("stop");
        } else if control.is_paused() != paused_sent && !stop_sent {
            let line = if control.is_paused() { "pause" } else { "resume" };
            if ranks.tell_leader(line) {
                paused_sent = control.is_paused();
            }
        }
    });
    // The leader's last events (its final one) may still be in the pipe.
    let _ = reader.join();
    for event in events.try_iter() {
        forward(event, outlet);
    }
    match (waited, leader_failed) {
        (Err(launcher), Some(TrainEvent::Failed { step, message, kind }))
            if !launcher.to_string().contains("rank 0 (device 0)") =>
        {
            let message = format!("{launcher}\n(rank 0: {message})");
            outlet.emit(TrainEvent::Failed { step, message, kind });
            Ok(())
        }
        (_, Some(failed)) => {
            outlet.emit(failed);
            Ok(())
        }
        (waited, None) => waited,
    }
}
