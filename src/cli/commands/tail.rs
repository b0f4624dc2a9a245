//! `flotilla tail` (and `submit` after it submitted): prints a run's events until it ends,
//! with the live summary line on a terminal; reconnects when the daemon restarts; Ctrl-C
//! stops following (exit 130) and says how to resume.

use std::time::Duration;

use flotilla_actors::protocol::{EventKind, RunOutcome};
use futures::StreamExt;

use crate::api::status::RunStatus;
use crate::cli::client::{Client, ClientError, segment};
use crate::cli::error::{CliError, Exit};
use crate::cli::render::events;
use crate::cli::render::live::{LiveLine, terminal_columns};
use crate::cli::render::style::{CLEAR_LINE, Style};
use crate::cli::{emit, note};
use crate::text_safety;

/// The exit code for how a followed run ended.
pub fn exit_for(outcome: Option<RunOutcome>) -> Exit {
    match outcome {
        Some(RunOutcome::Completed) => Exit::Ok,
        Some(_) => Exit::RunUnsuccessful,
        None => Exit::Failure,
    }
}

/// The outcome of a run that has finished, from its status; `None` while it runs.
async fn finished_outcome(client: &Client, run: &str) -> Result<Option<RunOutcome>, CliError> {
    let status: RunStatus = client.get(&format!("/v1/runs/{}", segment(run))).await?;
    Ok(match status.state.as_str() {
        "completed" => Some(RunOutcome::Completed),
        "failed" => Some(RunOutcome::Failed),
        "cancelled" => Some(RunOutcome::Cancelled),
        _ => None,
    })
}

/// Prints a run's events until `run_finished`, reconnecting (from the last seq) if the
/// daemon restarts meanwhile. Returns the outcome. Ctrl-C stops following (not the run) and
/// says how to follow it again from where it stopped.
pub async fn follow(
    client: &Client,
    run: &str,
    since: Option<u64>,
    json: bool,
) -> Result<Option<RunOutcome>, CliError> {
    let style = Style::detect();
    let live = style.live && !json;
    let last = std::cell::Cell::new(since);
    tokio::select! {
        outcome = follow_from(client, run, &last, json, style) => outcome,
        _ = tokio::signal::ctrl_c() => {
            if live {
                // End the live summary line.
                let _ = emit("\n");
            }
            let since = last
                .get()
                .map(|seq| format!(" --since {seq}"))
                .unwrap_or_default();
            note(&format!(
                "stopped following; run {} goes on in the daemon. Follow it again with \
                 `flotilla tail {}{since}`",
                text_safety::terminal_safe(run),
                text_safety::terminal_safe(run)
            ));
            Err(CliError::interrupted())
        }
    }
}

/// [`follow`]'s work; `last` is the seq of the last event printed.
async fn follow_from(
    client: &Client,
    run: &str,
    last: &std::cell::Cell<Option<u64>>,
    json: bool,
    style: Style,
) -> Result<Option<RunOutcome>, CliError> {
    let live = style.live && !json;
    let whole_run = last.get().is_none();
    // Events up to here were printed before (`tail --since`): on a terminal they are still
    // read, from the run's start, and folded into the live line (whose counts are the
    // run's graph), but not printed again.
    let printed_before = last.get().unwrap_or(0);
    // The seq of the last event folded into the live line.
    let mut folded: Option<u64> = None;
    // Whether a live line is on the screen (it ends with a line break when following ends).
    let mut drawn = false;
    let mut status_line = LiveLine::default();
    let mut spend = events::SpendFold::default();
    if live {
        // The live line shows spending against the run's budget; without it, spending alone.
        if let Ok(status) = client
            .get::<RunStatus>(&format!("/v1/runs/{}", segment(run)))
            .await
        {
            status_line.set_budget(status.graph.run_budget);
            status_line.set_created(status.created_ms);
        }
    }
    // When the daemon goes away mid-run, keep trying for a minute: it resumes the run.
    let mut lost_at: Option<std::time::Instant> = None;
    loop {
        let from = if live { folded } else { last.get() };
        let mut stream = match client.events(run, from).await {
            Ok(stream) => {
                lost_at = None;
                stream
            }
            Err(ClientError::DaemonNotRunning { .. })
                if lost_at.is_some_and(|t| t.elapsed() < Duration::from_secs(60)) =>
            {
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        // On a terminal the summary's clock ticks between events too.
        let mut ticker = tokio::time::interval(Duration::from_secs(1));
        loop {
            let item = tokio::select! {
                item = stream.next() => item,
                _ = ticker.tick(), if live && status_line.started() => {
                    drawn = true;
                    emit(&format!(
                        "{CLEAR_LINE}{}",
                        style.dim(&status_line.live_line(now_ms(), terminal_columns()))
                    ))?;
                    continue;
                }
            };
            let event = match item {
                Some(Ok(event)) => event,
                _ => break,
            };
            if live && event.seq > 0 {
                folded = Some(event.seq);
                if event.seq <= printed_before {
                    status_line.observe(&event);
                    continue;
                }
            }
            // Notices (seq 0) are not in the journal: resuming from them would replay all.
            if event.seq > 0 {
                last.set(Some(event.seq));
            }
            if json {
                emit(&format!("{}\n", text_safety::json_line(&event)))?;
            } else {
                status_line.observe(&event);
                let mut text = String::new();
                if live {
                    text.push_str(CLEAR_LINE);
                }
                // A streaming call's progress and an agent's activity update the live line
                // only; without one (a pipe, a log) they are left out: what they led to
                // comes with the answer or the handoff.
                // Charges are summed per attempt and said when it ends (`SpendFold`).
                if spend.absorb(&event.kind)
                    || matches!(
                        event.kind,
                        EventKind::LlmProgress { .. } | EventKind::AgentActivity { .. }
                    )
                {
                    if !live {
                        continue;
                    }
                } else {
                    text.push_str(&events::event_line(&event, &style));
                    text.push('\n');
                    for line in spend.ended(&event.kind) {
                        text.push_str(&events::folded_line(&line, event.at_ms, &style));
                        text.push('\n');
                    }
                }
                if live {
                    drawn = true;
                    // As of this event: a replayed backlog shows the time it happened at.
                    text.push_str(
                        &style.dim(&status_line.live_line(event.at_ms, terminal_columns())),
                    );
                }
                emit(&text)?;
            }
            if let EventKind::RunFinished { outcome, .. } = event.kind {
                if live {
                    emit("\n")?;
                }
                // The whole run was followed: its totals, and what reached main. (Live,
                // the totals are the line just ended.)
                if !json && whole_run {
                    if !live {
                        emit(&format!("{}\n", status_line.summary(event.at_ms)))?;
                    }
                    if let Some(landing) = status_line.landing_summary() {
                        emit(&format!("{}\n", style.dim(&landing)))?;
                    }
                }
                return Ok(Some(outcome));
            }
        }
        // The stream ended before `run_finished`. Either there was nothing after `since` in a
        // run that had already finished (its outcome says so), or the daemon went away.
        if let Ok(Some(outcome)) = finished_outcome(client, run).await {
            if live && drawn {
                emit("\n")?;
            }
            return Ok(Some(outcome));
        }
        if !json {
            note(&style.dim("lost the daemon; reconnecting…"));
        }
        lost_at.get_or_insert_with(std::time::Instant::now);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
