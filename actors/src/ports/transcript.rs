//! The transcript port: where an agent writes its conversation as it happens (the built-in
//! agent's messages, tool calls and results; a command agent's output lines; the scripted
//! agent's steps), one entry at a time, so that `flotilla log` can show what an attempt
//! did (ADR-036). The sink never blocks and never fails: the daemon's writer bounds what
//! it keeps and writes off every actor's thread; an agent outside a run writes to nobody.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::protocol::{RunId, TaskId};

/// What an entry of a transcript is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TranscriptKind {
    /// What flotilla told the agent (a system prompt, the task, a nudge, a refusal).
    Prompt,
    /// What the model said.
    Assistant,
    /// A tool the model called, with its arguments.
    ToolCall,
    /// What the tool answered.
    ToolResult,
    /// A line a command agent wrote to its standard output.
    Stdout,
    /// A line a command agent wrote to its standard error.
    Stderr,
    /// A step of the scripted agent, or a note of flotilla's about the attempt.
    Step,
    /// The transcript reached its size cap: later entries were dropped.
    Truncated,
    /// The attempt ended: nothing more will be written.
    End,
}

/// The daemon's side of one attempt's transcript.
pub trait TranscriptWriter: Send + Sync {
    /// Keeps one entry (cut, or dropped past the cap, as the writer decides).
    fn record(&self, kind: TranscriptKind, text: &str);
    /// The attempt ended.
    fn end(&self);
}

/// Where an agent writes its transcript: cheap to clone, never blocks, never fails.
#[derive(Clone, Default)]
pub struct TranscriptSink(Option<Arc<dyn TranscriptWriter>>);

impl TranscriptSink {
    pub fn new(writer: Arc<dyn TranscriptWriter>) -> Self {
        TranscriptSink(Some(writer))
    }

    /// Writes to nobody: for agents called outside a run.
    pub fn none() -> Self {
        TranscriptSink(None)
    }

    pub fn record(&self, kind: TranscriptKind, text: &str) {
        if let Some(writer) = &self.0 {
            writer.record(kind, text);
        }
    }

    pub fn end(&self) {
        if let Some(writer) = &self.0 {
            writer.end();
        }
    }
}

impl fmt::Debug for TranscriptSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TranscriptSink")
    }
}

type OpenFn = dyn Fn(RunId, &TaskId, u32) -> TranscriptSink + Send + Sync;

/// Opens the transcript of one attempt (a run's Workers share it).
#[derive(Clone, Default)]
pub struct Transcripts(Option<Arc<OpenFn>>);

impl Transcripts {
    pub fn new(
        open: impl Fn(RunId, &TaskId, u32) -> TranscriptSink + Send + Sync + 'static,
    ) -> Self {
        Transcripts(Some(Arc::new(open)))
    }

    /// Keeps no transcripts.
    pub fn none() -> Self {
        Transcripts(None)
    }

    pub fn open(&self, run: RunId, task: &TaskId, attempt: u32) -> TranscriptSink {
        match &self.0 {
            Some(open) => open(run, task, attempt),
            None => TranscriptSink::none(),
        }
    }
}

impl fmt::Debug for Transcripts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Transcripts")
    }
}
