//! `GET /v1/runs/{id}/tasks/{task}/transcript[?attempt=N&from=OFFSET&wait=true]`: an
//! attempt's transcript (`flotilla log`, ADR-036), from a byte offset of its file on; with
//! `wait`, the daemon holds the answer until there is something new or the attempt ended
//! (a long poll: `--follow` asks again with `next`).

use flotilla_actors::ports::TranscriptKind;
use serde::{Deserialize, Serialize};

/// One entry, as it is stored (one JSON line of the attempt's file) and sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TranscriptLine {
    pub at_ms: u64,
    pub kind: TranscriptKind,
    /// As the agent wrote it (cut to the entry cap): not safe for a terminal.
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transcript {
    pub run: String,
    pub task: String,
    /// 0 when a long poll ended before any attempt of the task wrote.
    pub attempt: u32,
    /// Every attempt of the task that has a transcript, oldest first.
    pub attempts: Vec<u32>,
    pub entries: Vec<TranscriptLine>,
    /// The offset to ask from next.
    pub next: u64,
    /// Nothing more will come: the attempt ended (or its run did).
    pub ended: bool,
}
