//! The result envelope a CLI hands back (ADR-017): how the prompt tells it to, the
//! examples a prompt shows (an envelope equal to one is an echo), the result file read
//! safely, and the envelope found at the end of a final message. Knows nothing of
//! processes or streams.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use flotilla_actors::llm::output::parse_json_answer;

use super::config::ResultVia;
use crate::agents::tools::FinishArgs;

/// The prompt file, in the worktree's root, for `prompt = "file"`.
pub const PROMPT_FILE: &str = "FLOTILLA_TASK.md";
/// The result file, in the worktree's root, for `result = "file"`: inside the worktree
/// because it is the one place a sandboxed CLI may write.
pub const RESULT_FILE: &str = "FLOTILLA_RESULT.json";
/// The variable that gives the CLI the result file's absolute path.
pub const RESULT_FILE_VAR: &str = "FLOTILLA_RESULT_FILE";

/// Why a call's result file holds no envelope: each message says what was wrong with the
/// file, never what it held.
#[derive(Debug, thiserror::Error)]
pub(super) enum ResultFileError {
    #[error("the file is missing")]
    Missing,
    #[error("it is a symbolic link, not a file the agent wrote")]
    Link,
    #[error("it is not a regular file")]
    NotRegular,
    #[error("it has {0} hard links: a link to another file is not a result")]
    HardLinks(u64),
    #[error("it is {0} bytes; at most {MAX_ENVELOPE_BYTES} are read")]
    TooLarge(u64),
    #[error("it grew past {MAX_ENVELOPE_BYTES} bytes while it was read")]
    Grew,
    #[error("the file is empty")]
    Empty,
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// What the answer parser says of the text (it quotes none of it).
    #[error(transparent)]
    NotAnEnvelope(flotilla_actors::llm::output::AnswerError),
}

/// Why a call handed back no envelope (the agent's name and its last output are added).
#[derive(Debug, thiserror::Error)]
pub(super) enum EnvelopeError {
    #[error("wrote no result envelope to {RESULT_FILE}: {0}")]
    File(ResultFileError),
    #[error("wrote no result envelope to {RESULT_FILE}")]
    NoFile,
    #[error("ended its final message with no result envelope")]
    NotInMessage,
    #[error("has no final message to read a result envelope from")]
    NoFinalMessage,
}

/// The most of a handoff's text read from the CLI (the result file, or the end of its
/// final text): the built-in agent's bound for a handoff written as text.
pub(super) const MAX_ENVELOPE_BYTES: usize = 256 * 1024;

/// `{` positions tried, from the end, when looking for the envelope in a text: enough for
/// an envelope after pages of code, and a bound on the work a brace-filled output costs.
const MAX_ENVELOPE_TRIES: usize = 2_000;

/// The handoffs shown as examples in a prompt: each fenced JSON block that is one.
pub(super) fn prompt_examples(prompt: &str) -> Vec<FinishArgs> {
    prompt
        .split("```json")
        .skip(1)
        .filter_map(|after| after.split("```").next())
        .filter_map(|block| serde_json::from_str::<FinishArgs>(block.trim()).ok())
        .filter(|example| !example.summary.trim().is_empty())
        .collect()
}

/// How to hand back, for a CLI: it has no `finish` tool.
pub(super) fn envelope_instructions(result: ResultVia, root: &Path) -> String {
    let mut text = String::from(
        "## Handing back\nYou have no `finish` tool: your handoff is the JSON object described above (status, summary, files_changed, concerns, suggestions, and a subplan if you propose one). ",
    );
    match result {
        ResultVia::Stream => text.push_str(
            "When you are done, end your final message with it, as one JSON object, with nothing after it. Write your own: the example above is only its shape, and an envelope equal to it is refused.\n",
        ),
        ResultVia::File => text.push_str(&format!(
            "When you are done, write it, as one JSON object and nothing else, to the file {RESULT_FILE} in the repository root ({}; its path is also in ${RESULT_FILE_VAR}). Only that file counts: what you print is not read for it. Write your own: the example above is only its shape, and an envelope equal to it is refused.\n",
            root.join(RESULT_FILE).display()
        )),
    }
    text.push_str(&format!(
        "flotilla removes {PROMPT_FILE} and {RESULT_FILE} itself: never commit them. flotilla commits everything else you leave in the worktree.\n"
    ));
    text
}

/// The result file's text, read through one descriptor so that what is checked is what
/// is read: not followed if it is a link (`O_NOFOLLOW`), never waited on if it is a FIFO
/// (`O_NONBLOCK`), only a regular file with a single link (a hard link would hand back a
/// file the CLI did not write: a repository file, one outside the worktree), and only as
/// much as a handoff may be.
pub(super) async fn read_result_file(path: &Path) -> Result<String, ResultFileError> {
    use tokio::io::AsyncReadExt;
    let file = match tokio::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .await
    {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ResultFileError::Missing);
        }
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(ResultFileError::Link);
        }
        Err(e) => return Err(e.into()),
    };
    let meta = file.metadata().await?;
    if !meta.is_file() {
        return Err(ResultFileError::NotRegular);
    }
    if meta.nlink() != 1 {
        return Err(ResultFileError::HardLinks(meta.nlink()));
    }
    if meta.len() > MAX_ENVELOPE_BYTES as u64 {
        return Err(ResultFileError::TooLarge(meta.len()));
    }
    let mut bytes = Vec::new();
    // Bounded again in the read: the file may grow after the check.
    file.take(MAX_ENVELOPE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .await?;
    if bytes.len() > MAX_ENVELOPE_BYTES {
        return Err(ResultFileError::Grew);
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ResultFileError::Empty);
    }
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The envelope in a CLI's final text: the *last* JSON object in it that is one (a CLI's
/// text may show code full of braces, or echo the example envelope of its prompt, before
/// its own); failing that, whatever [`parse_json_answer`] finds.
pub(super) fn envelope_in(text: &str) -> Option<FinishArgs> {
    let mut start = text.len().saturating_sub(MAX_ENVELOPE_BYTES);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    let end = &text[start..];
    for (at, _) in end.rmatch_indices('{').take(MAX_ENVELOPE_TRIES) {
        let mut values = serde_json::Deserializer::from_str(&end[at..]).into_iter::<FinishArgs>();
        if let Some(Ok(args)) = values.next() {
            return Some(args);
        }
    }
    parse_json_answer(end, MAX_ENVELOPE_BYTES).ok()
}

#[cfg(test)]
#[path = "envelope_tests.rs"]
mod tests;
