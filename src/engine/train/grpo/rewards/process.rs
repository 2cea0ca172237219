//! Running one child process for a reward program: write its stdin, drain stdout and stderr on their own threads
//! (no pipe can fill and deadlock), wait with a timeout and a stop flag, and on either kill its whole process
//! group and reap it, so neither the child nor anything it started is left behind.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// The most bytes kept of each output stream (its tail); the rest is read and dropped.
const KEEP_BYTES: usize = 64 * 1024;
/// How long to wait for the output pipes to close after the child exited (a background grandchild may hold them).
const PIPE_GRACE: Duration = Duration::from_millis(500);
/// The longest pause between two looks at the child.
const MAX_POLL: Duration = Duration::from_millis(10);

/// What became of a run.
#[derive(Debug)]
pub enum Outcome {
    /// The child exited by itself.
    Exited { status: ExitStatus, stdout: String, stderr: String },
    /// The child ran past the timeout and was killed.
    TimedOut { stderr: String },
    /// The stop flag was raised and the child was killed.
    Stopped,
}

/// Run `program` with `args` (no shell), `input` on its stdin, for at most `timeout`; `stop` is checked while it
/// runs. An error means the child could not be started or watched.
pub fn run(
    program: &Path,
    args: &[String],
    input: &[u8],
    timeout: Duration,
    stop: &AtomicBool,
) -> std::io::Result<Outcome> {
    let mut command = Command::new(program);
    command.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    #[cfg(unix)]
    {
        // Its own process group, so a timeout also kills what it started (`sh script` runs `sleep` as a child).
        use std::os::unix::process::CommandExt;
        command.process_group(0);
    }
    let mut child = command.spawn()?;
    let watched = watch(&mut child, input, timeout, stop);
    if watched.is_err() {
        kill_group(&mut child);
    }
    watched
}

/// Feed, drain and wait for the child; it is killed and reaped here on a timeout or a stop.
fn watch(child: &mut Child, input: &[u8], timeout: Duration, stop: &AtomicBool) -> std::io::Result<Outcome> {
    let stdout = Tail::spawn(child.stdout.take())?;
    let stderr = Tail::spawn(child.stderr.take())?;
    if let Some(mut pipe) = child.stdin.take() {
        let input = input.to_vec();
        // A thread, so a program that never reads its stdin cannot block us past the timeout; a program that
        // exits without reading it (a broken pipe) is its own business.
        std::thread::Builder::new().name("reward-stdin".into()).spawn(move || {
            let _ = pipe.write_all(&input);
        })?;
    }
    let start = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Outcome::Exited {
                status,
                stdout: stdout.finish(PIPE_GRACE),
                stderr: stderr.finish(PIPE_GRACE),
            });
        }
        if stop.load(Ordering::Relaxed) {
            kill_group(child);
            return Ok(Outcome::Stopped);
        }
        if start.elapsed() >= timeout {
            kill_group(child);
            return Ok(Outcome::TimedOut { stderr: stderr.finish(PIPE_GRACE) });
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(MAX_POLL);
    }
}

/// Kill the child and its process group, then reap it (no zombie).
fn kill_group(child: &mut Child) {
    #[cfg(unix)]
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: kill(2) on our own child's process group (pgid == its pid, set at spawn); no memory is touched.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The last [`KEEP_BYTES`] of a pipe, read to its end on a thread of its own.
struct Tail {
    kept: Arc<Mutex<Vec<u8>>>,
    closed: mpsc::Receiver<()>,
}

impl Tail {
    fn spawn(pipe: Option<impl Read + Send + 'static>) -> std::io::Result<Self> {
        let kept = Arc::new(Mutex::new(Vec::new()));
        let (done, closed) = mpsc::channel();
        if let Some(mut pipe) = pipe {
            let sink = Arc::clone(&kept);
            std::thread::Builder::new().name("reward-output".into()).spawn(move || {
                let mut chunk = [0u8; 8192];
                while let Ok(n @ 1..) = pipe.read(&mut chunk) {
                    let Ok(mut kept) = sink.lock() else { break };
                    kept.extend_from_slice(&chunk[..n]);
                    if kept.len() > KEEP_BYTES {
                        let cut = kept.len() - KEEP_BYTES;
                        kept.drain(..cut);
                    }
                }
                let _ = done.send(());
            })?;
        }
        Ok(Self { kept, closed })
    }

    /// What was read, once the pipe closed or `grace` passed (a background grandchild may keep it open).
    fn finish(self, grace: Duration) -> String {
        let _ = self.closed.recv_timeout(grace);
        let kept = self.kept.lock().map(|k| k.clone()).unwrap_or_default();
        String::from_utf8_lossy(&kept).into_owned()
    }
}
