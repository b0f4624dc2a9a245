//! `flotilla log RUN TASK [--attempt N] [--follow] [--json]`: an attempt's transcript
//! (ADR-036), escaped for the terminal. `--follow` asks the daemon again from where the
//! last answer stopped, each ask held by the daemon until there is something new (a long
//! poll), until the attempt ends.

use crate::api::transcript::TranscriptLine;
use crate::cli::client::Client;
use crate::cli::emit;
use crate::cli::error::{CliError, Exit};
use crate::text_safety;

pub async fn run(
    client: &Client,
    run: &str,
    task: &str,
    attempt: Option<u32>,
    follow: bool,
    json: bool,
) -> Result<Exit, CliError> {
    // Followed, a task that has not started yet is waited for.
    let mut transcript = client.transcript(run, task, attempt, 0, follow).await?;
    while follow && transcript.attempt == 0 && !transcript.ended {
        transcript = client.transcript(run, task, attempt, 0, true).await?;
    }
    if !json {
        let others = if transcript.attempts.len() > 1 {
            format!(" (attempts with a transcript: {:?})", transcript.attempts)
        } else {
            String::new()
        };
        emit(&format!(
            "run {} task {} attempt {}{others}\n",
            transcript.run,
            text_safety::terminal_safe(&transcript.task),
            transcript.attempt
        ))?;
    }
    // Pinned: a retry starting meanwhile is another attempt, with its own log.
    let attempt = Some(transcript.attempt).filter(|n| *n > 0);
    loop {
        for entry in &transcript.entries {
            emit(&if json {
                format!("{}\n", text_safety::json_line(entry))
            } else {
                entry_text(entry)
            })?;
        }
        if !follow || transcript.ended {
            return Ok(Exit::Ok);
        }
        transcript = client
            .transcript(run, task, attempt, transcript.next, true)
            .await?;
    }
}

/// One entry as text: its kind, then its lines, each escaped for the terminal.
pub fn entry_text(entry: &TranscriptLine) -> String {
    let kind = serde_json::to_value(entry.kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    let mut out = String::new();
    let mut lines = entry.text.lines();
    let first = lines.next().unwrap_or("");
    out.push_str(&format!(
        "{kind:>11} │ {}\n",
        text_safety::terminal_safe(first)
    ));
    for line in lines {
        out.push_str(&format!(
            "{:>11} │ {}\n",
            "",
            text_safety::terminal_safe(line)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_actors::ports::TranscriptKind;

    #[test]
    fn an_entry_is_shown_line_by_line_and_escaped() {
        let entry = TranscriptLine {
            at_ms: 1,
            kind: TranscriptKind::ToolResult,
            text: "ok\n\u{1b}]0;owned\u{7}\u{1b}[2J\rdone".into(),
        };
        let text = entry_text(&entry);
        assert_eq!(
            text,
            "tool_result │ ok\n            │ \\x1b]0;owned\\x07\\x1b[2J\\x0ddone\n"
        );
    }
}
