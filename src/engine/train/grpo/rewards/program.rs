//! The user's reward program: a command run once per completion, without a shell. It reads one JSON line on
//! stdin, `{"prompt", "prompt_text", "completion", "answer"}` (`prompt` is the row's prompt: a string, or its
//! messages as `[{"role", "content"}]`; `answer` is a string or null), and prints its score as the last non-empty
//! line of stdout. A failure (it cannot start, exits non-zero, runs past its timeout, prints anything but a finite
//! number) is an error naming the row, never a score.

use super::process::{self, Outcome};
use crate::engine::data::formats::{PreferenceTurns, PromptRow};
use crate::engine::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// The flag a reward program comes from, for messages.
pub const FLAG: &str = "--reward-program";
/// How much of a failing program's stderr a message quotes (its end).
const STDERR_CHARS: usize = 400;

/// A reward program, checked and ready to run.
#[derive(Debug, Clone)]
pub struct Program {
    /// The command as given (for messages).
    command: Vec<String>,
    /// The executable `command[0]` resolved to.
    path: PathBuf,
    timeout: Duration,
    /// The reward's name in metrics (`program`, `program_2`).
    name: String,
}

impl Program {
    /// Check the command: not empty, its program on PATH (or a path) and executable, and a timeout that is a
    /// positive number of seconds (at most an hour).
    pub fn new(command: &[String], timeout_secs: f64, name: &str) -> Result<Self> {
        let shown = join_command(command);
        let bad = |what: String| Error::InvalidSetting(format!("reward {name} ({FLAG} `{shown}`): {what}"));
        let Some(program) = command.first().filter(|p| !p.trim().is_empty()) else {
            return Err(
                bad("the command is empty; give a program and its arguments, e.g. \"python3 score.py\"".into()),
            );
        };
        if !(timeout_secs.is_finite() && timeout_secs > 0.0 && timeout_secs <= 3600.0) {
            return Err(bad(format!(
                "the timeout is {timeout_secs} seconds; it must be above 0 and at most 3600 (--reward-timeout)"
            )));
        }
        let path = resolve(program).map_err(bad)?;
        Ok(Self { command: command.to_vec(), path, timeout: Duration::from_secs_f64(timeout_secs), name: name.into() })
    }

    /// "reward program (--reward-program `python3 score.py`)", for messages.
    pub fn describe(&self) -> String {
        format!("reward {} ({FLAG} `{}`)", self.name, join_command(&self.command))
    }

    /// Score one completion of `row` (at `location`); `stop` kills the program and gives [`Error::Cancelled`].
    pub fn score(&self, row: &PromptRow, completion: &str, location: &str, stop: &AtomicBool) -> Result<f64> {
        let input = input_line(row, completion);
        let failed = |what: String| Error::Reward(format!("{} failed on {location}: {what}", self.describe()));
        let outcome = process::run(&self.path, &self.command[1..], input.as_bytes(), self.timeout, stop)
            .map_err(|e| failed(format!("it could not be started or watched: {e}")))?;
        match outcome {
            Outcome::Stopped => Err(Error::Cancelled),
            Outcome::TimedOut { stderr } => Err(failed(format!(
                "it ran past its timeout of {} s (--reward-timeout) and was killed{}",
                self.timeout.as_secs_f64(),
                stderr_tail(&stderr)
            ))),
            Outcome::Exited { status, stderr, .. } if !status.success() => {
                Err(failed(format!("it exited with {status}{}", stderr_tail(&stderr))))
            }
            Outcome::Exited { stdout, stderr, .. } => {
                parse_score(&stdout).map_err(|what| failed(format!("{what}{}", stderr_tail(&stderr))))
            }
        }
    }
}

/// The JSON line a reward program reads (with its newline).
pub fn input_line(row: &PromptRow, completion: &str) -> String {
    let prompt = match &row.prompt {
        PreferenceTurns::Text(text) => serde_json::Value::String(text.clone()),
        PreferenceTurns::Messages(messages) => messages
            .iter()
            .map(|m| serde_json::json!({ "role": m.role, "content": m.content }))
            .collect::<Vec<_>>()
            .into(),
    };
    let line = serde_json::json!({
        "prompt": prompt,
        "prompt_text": row.prompt_text(),
        "completion": completion,
        "answer": row.answer,
    });
    format!("{line}\n")
}

/// The score in a program's stdout: its last non-empty line, a finite number.
fn parse_score(stdout: &str) -> std::result::Result<f64, String> {
    let want = "a reward program must print one finite number (its score) as the last line of its output";
    let Some(last) = stdout.lines().map(str::trim).rfind(|l| !l.is_empty()) else {
        return Err(format!("it printed nothing; {want}"));
    };
    let shown: String = last.chars().take(80).collect();
    match last.parse::<f64>() {
        Ok(score) if score.is_finite() => Ok(score),
        Ok(_) => Err(format!("it printed `{shown}`, which is not a finite number; {want}")),
        Err(_) => Err(format!("it printed `{shown}`, not a number; {want}")),
    }
}

/// "; its stderr ends: ..." with the last [`STDERR_CHARS`] characters of stderr, or nothing when it was empty.
fn stderr_tail(stderr: &str) -> String {
    let trimmed = stderr.trim();
    if trimmed.is_empty() {
        return String::new();
    }
    let count = trimmed.chars().count();
    let tail: String = trimmed.chars().skip(count.saturating_sub(STDERR_CHARS)).collect();
    let cut = if count > STDERR_CHARS { "…" } else { "" };
    format!("; its stderr ends:\n{cut}{tail}")
}

/// Where `program` runs from: a path (with a `/`) as given, made absolute, else the first match on PATH; it must
/// be an executable file.
fn resolve(program: &str) -> std::result::Result<PathBuf, String> {
    if program.contains(std::path::MAIN_SEPARATOR) || program.contains('/') {
        let path = std::path::absolute(program).map_err(|e| format!("cannot resolve `{program}`: {e}"))?;
        return match path.metadata() {
            Err(_) => Err(format!("`{}` does not exist", path.display())),
            Ok(m) if !m.is_file() => Err(format!("`{}` is not a file", path.display())),
            Ok(_) if !is_executable(&path) => Err(format!(
                "`{}` is not executable; make it so (chmod +x) or run it through its interpreter (\"python3 {program}\")",
                path.display()
            )),
            Ok(_) => Ok(path),
        };
    }
    let search = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&search)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file() && is_executable(candidate))
        .ok_or_else(|| format!("`{program}` is not found on PATH; install it or give its path"))
}

#[cfg(unix)]
fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata().is_ok_and(|m| m.permissions().mode() & 0o111 != 0)
}

#[cfg(not(unix))]
fn is_executable(path: &Path) -> bool {
    path.is_file()
}

/// Split a command line into its program and arguments the way a POSIX shell would quote them, without running a
/// shell: whitespace separates words; '...' is literal; "..." keeps spaces and takes \" \\ \$ \` escapes; a
/// backslash outside quotes escapes the next character. No variables, globs, pipes or redirections.
pub fn split_command(line: &str) -> std::result::Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => words.extend(word.take()),
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => w.push(c),
                        None => return Err(format!("unclosed ' quote in `{line}`")),
                    }
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(e @ ('"' | '\\' | '$' | '`')) => w.push(e),
                            Some('\n') => {}
                            Some(other) => w.extend(['\\', other]),
                            None => return Err(format!("unclosed \" quote in `{line}`")),
                        },
                        Some(c) => w.push(c),
                        None => return Err(format!("unclosed \" quote in `{line}`")),
                    }
                }
            }
            '\\' => match chars.next() {
                Some(e) => word.get_or_insert_with(String::new).push(e),
                None => return Err(format!("`{line}` ends in a lone backslash")),
            },
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    if words.is_empty() {
        return Err("the command is empty; give a program and its arguments, e.g. \"python3 score.py\"".into());
    }
    Ok(words)
}

/// A command as one line that [`split_command`] reads back to the same words (quoting words that need it).
pub fn join_command(words: &[String]) -> String {
    let quote = |w: &String| {
        let plain = !w.is_empty() && w.chars().all(|c| c.is_alphanumeric() || "-_./=:,+@%^".contains(c));
        if plain {
            w.clone()
        } else {
            format!("'{}'", w.replace('\'', r"'\''"))
        }
    };
    words.iter().map(quote).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::model::chat_template::ChatMessage;

    #[test]
    fn command_lines_split_like_a_shell_and_join_back() {
        let split = |s: &str| split_command(s).unwrap();
        assert_eq!(split("python3 score.py"), ["python3", "score.py"]);
        assert_eq!(split("  sh   'my dir/score.sh' --k \"a b\" "), ["sh", "my dir/score.sh", "--k", "a b"]);
        assert_eq!(split(r#"echo "say \"hi\" \$HOME" it\'s"#), ["echo", "say \"hi\" $HOME", "it's"]);
        assert_eq!(split("a ''"), ["a", ""]);
        assert!(split_command("sh 'oops").unwrap_err().contains("unclosed"));
        assert!(split_command("sh \"oops").unwrap_err().contains("unclosed"));
        assert!(split_command("   ").unwrap_err().contains("empty"));
        for line in ["python3 score.py", "sh 'my dir/x.sh' \"it's\" '' a$b"] {
            let words = split(line);
            assert_eq!(split(&join_command(&words)), words, "{line}");
        }
    }

    #[test]
    fn the_input_line_carries_prompt_completion_and_answer() {
        let text = PromptRow { prompt: PreferenceTurns::Text("2+2?".into()), answer: Some("4".into()), tools: None };
        let line = input_line(&text, "4");
        assert!(line.ends_with('\n'));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v, serde_json::json!({"prompt": "2+2?", "prompt_text": "2+2?", "completion": "4", "answer": "4"}));
        let messages = PromptRow {
            prompt: PreferenceTurns::Messages(vec![
                ChatMessage::new("system", "Be brief."),
                ChatMessage::new("user", "Hi"),
            ]),
            answer: None,
            tools: None,
        };
        let v: serde_json::Value = serde_json::from_str(&input_line(&messages, "")).unwrap();
        assert_eq!(
            v["prompt"],
            serde_json::json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
        );
        assert_eq!(v["prompt_text"], "Hi");
        assert!(v["answer"].is_null());
    }

    #[test]
    fn scores_are_the_last_line_and_must_be_finite() {
        assert_eq!(parse_score("log line\n0.75\n\n"), Ok(0.75));
        assert_eq!(parse_score("-1e-2"), Ok(-0.01));
        assert!(parse_score("").unwrap_err().contains("printed nothing"));
        assert!(parse_score("abc\n").unwrap_err().contains("`abc`, not a number"));
        assert!(parse_score("NaN").unwrap_err().contains("not a finite number"));
        assert!(parse_score("inf").unwrap_err().contains("not a finite number"));
    }

    #[test]
    fn stderr_is_quoted_by_its_end() {
        assert_eq!(stderr_tail("  \n"), "");
        let long = format!("{}THE END", "x".repeat(1000));
        let tail = stderr_tail(&long);
        assert!(tail.ends_with("THE END") && tail.chars().count() < 450, "{tail}");
    }

    #[test]
    fn programs_are_checked_before_any_run() {
        let words = |s: &str| split_command(s).unwrap();
        assert!(Program::new(&words("sh -c true"), 5.0, "program").is_ok());
        let err = Program::new(&words("no-such-program-xyz a"), 5.0, "program").unwrap_err().to_string();
        assert!(
            err.contains("not found on PATH") && err.contains(FLAG) && err.contains("no-such-program-xyz a"),
            "{err}"
        );
        let err = Program::new(&words("./no/such/file.py"), 5.0, "program_2").unwrap_err().to_string();
        assert!(err.contains("does not exist") && err.contains("program_2"), "{err}");
        let err = Program::new(&words("sh"), 0.0, "program").unwrap_err().to_string();
        assert!(err.contains("--reward-timeout"), "{err}");
        assert!(Program::new(&[], 5.0, "program").unwrap_err().to_string().contains("empty"));
    }
}
