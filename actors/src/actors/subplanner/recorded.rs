//! The Subplanner's exchanges as the journal holds them: what a resumed run's conversations
//! are rebuilt from.

use crate::llm::conversation::Exchange;
use crate::protocol::{EventKind, TaskId};

/// A recorded Subplanner exchange, as the journal holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedExchange {
    pub task: TaskId,
    pub attempt: u32,
    pub exchange: Exchange,
}

impl RecordedExchange {
    /// Every Subplanner exchange a run's journal holds, in order: what `resuming` needs.
    /// An answer not used (unusable, or its batch refused) comes back as the excerpt it was.
    pub fn from_journal<'a>(events: impl IntoIterator<Item = &'a EventKind>) -> Vec<Self> {
        let mut recorded: Vec<RecordedExchange> = Vec::new();
        for kind in events {
            match kind {
                EventKind::SubplannerResponded {
                    task,
                    attempt,
                    prompt,
                    content,
                    error,
                    ..
                } => recorded.push(RecordedExchange {
                    task: task.clone(),
                    attempt: *attempt,
                    exchange: Exchange::new(prompt.clone(), content.clone(), error.clone()),
                }),
                EventKind::DecompositionRejected {
                    parent,
                    attempt,
                    reason,
                } => {
                    let last = recorded
                        .iter_mut()
                        .rev()
                        .find(|r| r.task == *parent && r.attempt == *attempt)
                        .filter(|r| r.exchange.unused.is_none());
                    if let Some(last) = last {
                        let kept = std::mem::take(&mut last.exchange);
                        last.exchange = Exchange::new(
                            kept.prompt,
                            kept.answer,
                            Some(format!("the batch was refused: {reason}")),
                        );
                    }
                }
                _ => {}
            }
        }
        recorded
    }
}
