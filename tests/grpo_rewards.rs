//! GRPO's rewards with real child processes: a reward program's score, its order over parallel calls, and each way
//! it can fail (a timeout that kills it and what it started, a non-zero exit with its stderr, output that is not a
//! number, a cancel), each an error naming the row and the program; the preflight and the row check before
//! training; and `train`'s GRPO flags on the real binary (a bad `--reward` refused, GRPO flags with another method).
//! The programs are small `sh` scripts in a temporary folder.

use metal_candle::engine::data::{PreferenceTurns, PromptRow};
use metal_candle::engine::train::grpo::rewards::{RewardInput, Rewards};
use metal_candle::engine::train::grpo::{RewardKind, RewardSpec};
use metal_candle::engine::{Error, ErrorKind};
use std::path::Path;
use std::time::{Duration, Instant};

fn row(prompt: &str, answer: Option<&str>) -> PromptRow {
    PromptRow { prompt: PreferenceTurns::Text(prompt.into()), answer: answer.map(Into::into), tools: None }
}

/// A reward program `sh <dir>/<name>.sh` running `body`, with `timeout_secs` and `weight`.
fn program(dir: &Path, name: &str, body: &str, timeout_secs: f64, weight: f64) -> RewardSpec {
    let path = dir.join(format!("{name}.sh"));
    std::fs::write(&path, body).unwrap();
    let command = vec!["sh".to_string(), path.display().to_string()];
    RewardSpec { kind: RewardKind::Program { command, timeout_secs }, weight }
}

fn never() -> bool {
    false
}

/// Prints the completion (a number) back, after a pause on odd numbers so that calls finish out of order.
const ECHO_COMPLETION: &str = r#"line=$(cat)
n=$(printf '%s' "$line" | sed 's/.*"completion":"\([^"]*\)".*/\1/')
if [ $((n % 2)) -eq 1 ]; then sleep 0.1; fi
echo "log: scoring $n"
echo "$n"
"#;

#[test]
fn program_scores_keep_their_order_and_are_weighted_with_builtins() {
    let dir = tempfile::tempdir().unwrap();
    let specs = vec![
        RewardSpec { kind: RewardKind::ExactAnswer, weight: 1.0 },
        program(dir.path(), "echo", ECHO_COMPLETION, 10.0, 0.5),
        RewardSpec { kind: RewardKind::Length { budget: 4 }, weight: 2.0 },
    ];
    let rewards = Rewards::new(&specs).unwrap();
    assert_eq!(rewards.names(), ["exact_answer", "program", "length"]);
    assert_eq!(rewards.weights(), [1.0, 0.5, 2.0]);
    assert!(rewards.needs_answer());
    let prompt = row("Say a number", Some("7"));
    let texts: Vec<String> = (0..20).map(|i| i.to_string()).collect();
    let inputs: Vec<RewardInput> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| RewardInput { row: &prompt, completion: t, completion_tokens: i, location: "train.jsonl:3" })
        .collect();
    let start = Instant::now();
    let table = rewards.score(&inputs, &never).unwrap();
    let secs = start.elapsed().as_secs_f64();
    for (i, values) in table.values.iter().enumerate() {
        let exact = if i == 7 { 1.0 } else { 0.0 };
        let length = if i <= 4 { 0.0 } else { (-((i - 4) as f64) / 4.0).max(-1.0) };
        assert_eq!(values, &[exact, i as f64, length], "completion {i}");
        assert!((table.total[i] - (exact + 0.5 * i as f64 + 2.0 * length)).abs() < 1e-12, "total {i}");
    }
    // Ten odd calls pause 0.1 s each: in parallel on at least two threads, well under the one-by-one 1 s.
    eprintln!("20 program calls in {secs:.2} s");
}

#[test]
fn a_program_past_its_timeout_is_killed_with_what_it_started() {
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    let body = format!("echo $$ > '{0}'\nsleep 30 &\necho $! >> '{0}'\necho 'thinking...' >&2\nwait\n", pids.display());
    let rewards = Rewards::new(&[program(dir.path(), "slow", &body, 1.0, 1.0)]).unwrap();
    let prompt = row("p", None);
    let input = RewardInput { row: &prompt, completion: "x", completion_tokens: 1, location: "data/train.jsonl:17" };
    let start = Instant::now();
    let err = rewards.score(&[input], &never).unwrap_err();
    let secs = start.elapsed().as_secs_f64();
    assert!((1.0..2.0).contains(&secs), "took {secs:.2} s for a 1 s timeout");
    let msg = err.to_string();
    assert_eq!(err.kind(), ErrorKind::Reward);
    for part in ["data/train.jsonl:17", "--reward-program", "slow.sh", "timeout of 1 s", "killed", "thinking..."] {
        assert!(msg.contains(part), "`{part}` missing from: {msg}");
    }
    let pids = std::fs::read_to_string(&pids).unwrap();
    let pids: Vec<&str> = pids.lines().collect();
    assert_eq!(pids.len(), 2, "{pids:?}");
    // The shell was reaped (no zombie); the `sleep` it started was killed (gone, or dead and awaiting init).
    assert!(!Path::new(&format!("/proc/{}", pids[0])).exists(), "the program's process is still there");
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", pids[1])).unwrap_or_default();
        let state = stat.rsplit(')').next().and_then(|s| s.split_whitespace().next()).unwrap_or("");
        if stat.is_empty() || state == "Z" || state == "X" {
            break;
        }
        assert!(Instant::now() < deadline, "the program's child `sleep` still runs: {stat}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_failing_program_is_an_error_with_its_stderr_never_a_score() {
    let dir = tempfile::tempdir().unwrap();
    let prompt = row("p", Some("1"));
    let input = RewardInput { row: &prompt, completion: "1", completion_tokens: 1, location: "train.jsonl:9" };
    let cases = [
        ("crash", "echo 0.5\necho 'Traceback: KeyError: answer' >&2\nexit 1\n", "exited with exit status: 1"),
        ("words", "cat > /dev/null\necho abc\n", "printed `abc`, not a number"),
        ("nan", "echo nan\n", "not a finite number"),
        ("silent", "cat > /dev/null\n", "printed nothing"),
    ];
    for (name, body, want) in cases {
        let rewards = Rewards::new(&[program(dir.path(), name, body, 5.0, 1.0)]).unwrap();
        let err = rewards.score(&[input], &never).unwrap_err();
        let msg = err.to_string();
        assert_eq!(err.kind(), ErrorKind::Reward, "{msg}");
        assert!(msg.contains(want) && msg.contains("train.jsonl:9") && msg.contains(&format!("{name}.sh")), "{msg}");
        if name == "crash" {
            assert!(msg.contains("Traceback: KeyError: answer"), "{msg}");
        }
    }
}

#[test]
fn a_program_that_ignores_a_large_stdin_still_scores() {
    let dir = tempfile::tempdir().unwrap();
    let rewards = Rewards::new(&[program(dir.path(), "ignore", "echo 0.25\n", 5.0, 1.0)]).unwrap();
    let prompt = row(&"long prompt ".repeat(50_000), None);
    let inputs = [RewardInput { row: &prompt, completion: "c", completion_tokens: 1, location: "l:1" }; 3];
    assert_eq!(rewards.score(&inputs, &never).unwrap().total, [0.25; 3]);
}

#[test]
fn a_cancel_kills_running_programs() {
    let dir = tempfile::tempdir().unwrap();
    let rewards = Rewards::new(&[program(dir.path(), "sleepy", "sleep 30\necho 1\n", 60.0, 1.0)]).unwrap();
    let prompt = row("p", None);
    let inputs = [RewardInput { row: &prompt, completion: "c", completion_tokens: 1, location: "l:1" }; 6];
    let start = Instant::now();
    let cancel_at = start + Duration::from_millis(300);
    let err = rewards.score(&inputs, &|| Instant::now() >= cancel_at).unwrap_err();
    assert!(matches!(err, Error::Cancelled), "{err}");
    assert!(start.elapsed() < Duration::from_secs(2), "cancel took {:?}", start.elapsed());
}

#[test]
fn programs_are_tried_and_rows_checked_before_training() {
    let dir = tempfile::tempdir().unwrap();
    // Reads the JSON line and fails when the completion is empty, as a careless program would.
    let body =
        "line=$(cat)\ncase \"$line\" in *'\"completion\":\"\"'*) echo 'empty completion' >&2; exit 3;; esac\necho 1\n";
    let picky = Rewards::new(&[program(dir.path(), "picky", body, 5.0, 1.0)]).unwrap();
    let err = picky.preflight(&row("p", None), "train.jsonl:1").unwrap_err().to_string();
    assert!(err.contains("trial call") && err.contains("train.jsonl:1") && err.contains("empty completion"), "{err}");
    let fine = Rewards::new(&[program(dir.path(), "fine", "cat >/dev/null; echo 0", 5.0, 1.0)]).unwrap();
    fine.preflight(&row("p", None), "train.jsonl:1").unwrap();
    assert!(!fine.needs_answer());

    let exact = Rewards::new(&[RewardSpec { kind: RewardKind::ExactAnswer, weight: 1.0 }]).unwrap();
    let mut rows: Vec<PromptRow> = (0..9).map(|i| row("p", (i % 2 == 0).then_some("4"))).collect();
    rows.push(row("p", Some("  ")));
    let err = exact.check_rows(&rows, &|i| format!("train.jsonl:{}", i + 1)).unwrap_err().to_string();
    assert!(err.contains("5 of 10 rows"), "{err}");
    assert!(err.contains("train.jsonl:2, train.jsonl:4, train.jsonl:6, train.jsonl:8, train.jsonl:10"), "{err}");
    exact.check_rows(&rows[..1], &|i| i.to_string()).unwrap();
    fine.check_rows(&rows, &|i| i.to_string()).unwrap();
}

#[test]
fn bad_reward_settings_name_the_reward_and_flag() {
    let err = |specs: &[RewardSpec]| Rewards::new(specs).unwrap_err().to_string();
    let missing = RewardSpec {
        kind: RewardKind::Program { command: vec!["no-such-scorer-1234".into()], timeout_secs: 5.0 },
        weight: 1.0,
    };
    assert!(err(&[missing]).contains("`no-such-scorer-1234` is not found on PATH"));
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("score.sh");
    std::fs::write(&script, "echo 1\n").unwrap();
    let not_executable = RewardSpec {
        kind: RewardKind::Program { command: vec![script.display().to_string()], timeout_secs: 5.0 },
        weight: 1.0,
    };
    assert!(err(&[not_executable]).contains("is not executable"));
    let regexes = [
        RewardSpec { kind: RewardKind::Regex { pattern: "ok".into() }, weight: 1.0 },
        RewardSpec { kind: RewardKind::Regex { pattern: "(".into() }, weight: 1.0 },
    ];
    let msg = err(&regexes);
    assert!(msg.contains("reward regex_2 (--reward)") && msg.contains("not a valid regex"), "{msg}");
    assert!(err(&[]).contains("at least one reward"));
}

fn train(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_metal-candle"))
        .args(["train", "--model", "no-model.gguf", "--data", "no-data.jsonl"])
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn train_refuses_bad_reward_specs_and_grpo_flags_with_other_methods() {
    let out = train(&["--method", "grpo", "--reward", "length=10@0.5", "--reward", "lenght=10"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("unknown reward `lenght=10`") && stderr.contains("length=BUDGET"), "{stderr}");

    let out = train(&["--method", "dpo", "--num-generations", "4"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("--num-generations only apply to --method grpo"), "{stderr}");

    let out = train(&["--method", "grpo", "--reward-program", "python3 'unclosed"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("unclosed ' quote"), "{stderr}");
}
