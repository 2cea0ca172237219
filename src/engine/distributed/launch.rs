//! Starting the ranks of a data-parallel run on this host (`train --gpus N`, the studio's GPU count), as torchrun
//! does: one process per device, each running the same command with the launcher variables set (`RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`; see [`super::RankSpec::from_vars`]), and a supervisor
//! that waits for them. The leader's output is the run's output; the others' error output is kept (its last
//! lines) to explain a rank that fails. A rank that fails ends the others (they would wait for it in the next
//! collective), and the error names it. A stop request goes to the leader alone, which passes it on to the others
//! with the next step's gradients, so they all stop after the same step and the leader saves.
//!
//! The ranks run in their own process group (a Ctrl-C in the terminal reaches the supervisor, which asks the leader
//! to stop, instead of every rank at once) and, on Linux, die with the supervisor.

use crate::engine::{Error, Result};
use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Lines of a rank's error output kept for the message that explains its failure.
const TAIL_LINES: usize = 30;

/// Where the leader's standard output goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaderOutput {
    /// This process's (the CLI prints the run's progress there).
    Inherit,
    /// A pipe the caller reads ([`Launch::take_leader_stdout`]; the studio reads its JSON events), and one it writes
    /// control lines to ([`Launch::tell_leader`]: the leader runs with `--control-stdin`).
    Piped,
}

/// The ranks of a run started on this host.
pub struct Launch {
    ranks: Vec<RankProcess>,
    /// The leader's standard input, when it was piped.
    leader_stdin: Option<std::process::ChildStdin>,
}

struct RankProcess {
    rank: usize,
    child: Child,
    /// The last lines of its error output (not kept for the leader, whose output is the caller's).
    tail: Arc<Mutex<VecDeque<String>>>,
    exited: Option<ExitStatus>,
}

/// A TCP port on the loopback interface that is free now, for the rendezvous.
pub fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| Error::Distributed(format!("no free port for the rendezvous: {e}")))?;
    Ok(listener.local_addr().map_err(|e| Error::Distributed(e.to_string()))?.port())
}

/// Start `world` ranks of `program args` on this host, rank r on device r.
pub fn start(program: &Path, args: &[OsString], world: usize, leader_output: LeaderOutput) -> Result<Launch> {
    if world == 0 {
        return Err(Error::InvalidSetting("a data-parallel run needs at least one process".into()));
    }
    let port = free_port()?;
    let mut launch = Launch { ranks: Vec::with_capacity(world), leader_stdin: None };
    for rank in 0..world {
        let mut command = Command::new(program);
        command
            .args(args)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string());
        // NVLink multicast buys nothing for a LoRA's few megabytes of gradients and needs the fabric manager.
        if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
            command.env("NCCL_NVLS_ENABLE", "0");
        }
        let leader = rank == 0;
        let piped = leader && leader_output == LeaderOutput::Piped;
        command.stdin(if piped { Stdio::piped() } else { Stdio::null() });
        command.stdout(match (leader, leader_output) {
            (true, LeaderOutput::Inherit) => Stdio::inherit(),
            (true, LeaderOutput::Piped) => Stdio::piped(),
            (false, _) => Stdio::null(),
        });
        command.stderr(if leader { Stdio::inherit() } else { Stdio::piped() });
        detach(&mut command);
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                launch.end_all();
                return Err(Error::Distributed(format!("cannot start rank {rank} ({}): {e}", program.display())));
            }
        };
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(stderr) = child.stderr.take() {
            keep_tail(stderr, tail.clone());
        }
        if piped {
            launch.leader_stdin = child.stdin.take();
        }
        launch.ranks.push(RankProcess { rank, child, tail, exited: None });
    }
    Ok(launch)
}

/// The ranks' own process group, and on Linux a SIGTERM when the supervisor dies.
fn detach(command: &mut Command) {
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        command.process_group(0);
        #[cfg(target_os = "linux")]
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec here.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
    }
}

fn keep_tail(stream: impl std::io::Read + Send + 'static, tail: Arc<Mutex<VecDeque<String>>>) {
    let _ = std::thread::Builder::new().name("mc-rank-stderr".into()).spawn(move || {
        for line in BufReader::new(stream).lines().map_while(std::result::Result::ok) {
            if let Ok(mut tail) = tail.lock() {
                if tail.len() == TAIL_LINES {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
        }
    });
}

impl Launch {
    /// The leader's standard output, when it was piped (once).
    pub fn take_leader_stdout(&mut self) -> Option<ChildStdout> {
        self.ranks.first_mut().and_then(|r| r.child.stdout.take())
    }

    /// Send one control line (`stop`, `pause`, `resume`) to a leader whose input is piped; false when it cannot
    /// be delivered (the leader has ended).
    pub fn tell_leader(&mut self, line: &str) -> bool {
        use std::io::Write;
        let Some(stdin) = self.leader_stdin.as_mut() else { return false };
        stdin.write_all(format!("{line}\n").as_bytes()).and_then(|()| stdin.flush()).is_ok()
    }

    /// The ranks' process ids, in rank order.
    pub fn pids(&self) -> Vec<u32> {
        self.ranks.iter().map(|r| r.child.id()).collect()
    }

    /// Ask the leader to stop after the current step (it saves, and the others stop with it).
    pub fn request_stop(&self) {
        if let Some(leader) = self.ranks.first() {
            terminate(leader.child.id());
        }
    }

    /// Wait for every rank. `poll` runs about ten times a second (the caller's stop requests). Ok when all of them
    /// exit cleanly; otherwise the others are ended and the error names the first rank that failed, with the end of
    /// its output.
    pub fn wait(mut self, poll: &mut dyn FnMut(&mut Launch)) -> Result<()> {
        let mut leader_done: Option<Instant> = None;
        loop {
            poll(&mut self);
            let mut failed_now = Vec::new();
            for (index, rank) in self.ranks.iter_mut().enumerate() {
                if rank.exited.is_none() {
                    rank.exited = rank.child.try_wait().map_err(|e| Error::Distributed(e.to_string()))?;
                    if rank.exited.is_some_and(|s| !s.success()) {
                        failed_now.push(index);
                    }
                }
            }
            // A rank that fails takes the others down soon after (they see it gone): of those seen failing at the
            // same look, one killed by a signal is the cause rather than the ones that noticed it.
            failed_now.sort_by_key(|&i| (self.ranks[i].exited.is_some_and(|s| !killed_by_signal(s)), i));
            if let Some(&first) = failed_now.first() {
                let message = failure_message(&self.ranks[first]);
                self.end_all();
                return Err(Error::Distributed(message));
            }
            if self.ranks.iter().all(|r| r.exited.is_some()) {
                return Ok(());
            }
            // The others leave right after the leader; one that does not is stuck.
            if self.ranks[0].exited.is_some() {
                let since = *leader_done.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_secs(120) {
                    let stuck: Vec<usize> = self.ranks.iter().filter(|r| r.exited.is_none()).map(|r| r.rank).collect();
                    self.end_all();
                    return Err(Error::Distributed(format!(
                        "rank 0 finished but ranks {stuck:?} did not end within two minutes; they were stopped"
                    )));
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// End every rank still running: a SIGTERM, then after a few seconds a kill.
    fn end_all(&mut self) {
        let running = |r: &mut RankProcess| matches!(r.child.try_wait(), Ok(None));
        for rank in self.ranks.iter_mut().filter(|r| r.exited.is_none()) {
            if running(rank) {
                terminate(rank.child.id());
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && self.ranks.iter_mut().any(running) {
            std::thread::sleep(Duration::from_millis(50));
        }
        for rank in &mut self.ranks {
            if running(rank) {
                let _ = rank.child.kill();
            }
            let _ = rank.child.wait();
        }
    }
}

impl Drop for Launch {
    fn drop(&mut self) {
        if self.ranks.iter_mut().any(|r| matches!(r.child.try_wait(), Ok(None))) {
            self.end_all();
        }
    }
}

fn failure_message(failed: &RankProcess) -> String {
    let status = failed.exited.map(describe_status).unwrap_or_default();
    let tail: Vec<String> = failed.tail.lock().map(|t| t.iter().cloned().collect()).unwrap_or_default();
    let output = match (failed.rank, tail.is_empty()) {
        (0, _) => String::new(),
        (_, true) => "; it printed nothing".into(),
        (_, false) => format!("; the end of its output:\n  {}", tail.join("\n  ")),
    };
    format!(
        "rank {} (device {}) {status}; the other ranks were stopped, and the last checkpoint saved stays valid \
         (resume from it){output}",
        failed.rank, failed.rank
    )
}

fn killed_by_signal(status: ExitStatus) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        status.signal().is_some()
    }
    #[cfg(not(unix))]
    {
        let _ = status;
        false
    }
}

fn describe_status(status: ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return format!("was killed by signal {signal}");
        }
    }
    format!("exited with {status}")
}

/// Send SIGTERM to `pid` (a rank asked to stop; it saves and exits as on Ctrl-C).
fn terminate(pid: u32) {
    #[cfg(unix)]
    // SAFETY: sends a signal to a child this launcher started (and has not reaped).
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGTERM);
    }
    #[cfg(not(unix))]
    let _ = pid;
}
