//! `train --gpus N`, and `train` as one rank of a run that torchrun, SLURM or `--gpus` started: the CLI's side of
//! data-parallel training (the engine's is engine/distributed and train/distributed_share.rs).

use crate::engine::device::DeviceChoice;
use crate::engine::distributed::{launch, RankSpec};
use std::ffi::OsString;

/// The rank this process is, when a launcher set the variables for one (`RANK`, `WORLD_SIZE`, ...).
pub fn rank_from_env() -> anyhow::Result<Option<RankSpec>> {
    Ok(RankSpec::from_vars(|name| std::env::var(name).ok())?)
}

/// Start `gpus` ranks of this same command (without `--gpus`) on this host and wait for them. `config` is this
/// command's settings, checked and with its Hub sources downloaded by the caller before any rank starts.
pub fn launch_ranks(config: &crate::engine::train::TrainConfig, gpus: usize) -> anyhow::Result<()> {
    if config.device != DeviceChoice::Cpu {
        let found = crate::engine::device::cuda_device_count();
        if found < gpus {
            anyhow::bail!(
                "--gpus {gpus} needs {gpus} CUDA GPUs but this host has {found}{}; use --gpus {found} or fewer \
                 (or --device cpu to run {gpus} CPU processes, which only tests the data-parallel path)",
                if cfg!(feature = "cuda") { "" } else { " (this binary was built without --features cuda)" }
            );
        }
    }
    let program = std::env::current_exe()?;
    let rank_args = without_gpus_flag(std::env::args_os().skip(1));
    let ranks = launch::start(&program, &rank_args, gpus, launch::LeaderOutput::Inherit)?;
    eprintln!("started {gpus} ranks on this host (process ids {:?}); rank 0 reports the run", ranks.pids());
    // Ctrl-C or SIGTERM: the leader stops after the current step, the others with it; a second one exits at once.
    crate::stop_signals::install();
    let mut asked = false;
    ranks.wait(&mut |ranks| {
        if !asked && crate::stop_signals::requested() {
            asked = true;
            ranks.request_stop();
        }
    })?;
    Ok(())
}

/// Apply `stop`, `pause` and `resume` lines read from standard input to `control` (on a thread of its own, until
/// the input ends).
pub fn follow_control_lines(control: crate::engine::train::TrainControl) {
    let spawned = std::thread::Builder::new().name("mc-control".into()).spawn(move || {
        use std::io::BufRead;
        for line in std::io::stdin().lock().lines().map_while(std::result::Result::ok) {
            match line.trim() {
                "stop" => control.request_stop(),
                "pause" => control.set_paused(true),
                "resume" => control.set_paused(false),
                other => eprintln!("warning: unknown control line `{other}` (stop, pause or resume)"),
            }
        }
    });
    if let Err(e) = spawned {
        eprintln!("warning: cannot read control lines: {e}");
    }
}

/// The command line of a rank: this one without `--gpus N` (a rank must not launch ranks).
fn without_gpus_flag(args: impl Iterator<Item = OsString>) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut skip_value = false;
    for arg in args {
        if std::mem::take(&mut skip_value) {
            continue;
        }
        match arg.to_str() {
            Some("--gpus") => skip_value = true,
            Some(a) if a.starts_with("--gpus=") => {}
            _ => out.push(arg),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_gpus_flag_is_dropped_from_a_ranks_command_line() {
        let args = ["train", "--gpus", "2", "--model", "m", "--gpus=3", "--data", "d"].map(std::ffi::OsString::from);
        let kept = super::without_gpus_flag(args.into_iter());
        assert_eq!(kept, ["train", "--model", "m", "--data", "d"].map(std::ffi::OsString::from));
    }
}
