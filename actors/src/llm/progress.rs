//! Live progress of a streaming LLM call, as notices for `flotilla tail` (ADR-007): an
//! `LlmProgress` event with seq 0, never journaled, at most one per [`PROGRESS_EVERY`] per
//! call. Shared by every actor that calls a model, so they all say it the same way.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use actix::Recipient;

use crate::ports::{Clock, LlmCall, Role, SystemClock};
use crate::protocol::{Event, EventKind, Published, RunId, TaskId};

/// The least time between two progress notices of one call.
pub const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// `call`, reporting its streaming progress to `notices` (when there is anyone to tell).
pub fn with_progress_notices(
    call: LlmCall,
    notices: Option<&Recipient<Published>>,
    run: RunId,
    role: Role,
    task: Option<TaskId>,
) -> LlmCall {
    let Some(notices) = notices.cloned() else {
        return call;
    };
    let last_sent = Mutex::new(None::<Instant>);
    let (paused_to, paused_task) = (notices.clone(), task.clone());
    let call = call.on_pause(move |pause| {
        paused_to.do_send(Published(Event {
            seq: 0,
            run,
            at_ms: SystemClock.now_ms(),
            kind: EventKind::ProviderPaused {
                role,
                task: paused_task.clone(),
                provider: pause.provider,
                wait_ms: pause.wait_ms,
            },
        }));
    });
    call.on_progress(move |progress| {
        let now = Instant::now();
        let Ok(mut last) = last_sent.lock() else {
            return;
        };
        if last.is_some_and(|at| now.duration_since(at) < PROGRESS_EVERY) {
            return;
        }
        *last = Some(now);
        notices.do_send(Published(Event {
            seq: 0,
            run,
            at_ms: SystemClock.now_ms(),
            kind: EventKind::LlmProgress {
                role,
                task: task.clone(),
                tokens_out: progress.tokens_out,
            },
        }));
    })
}
