use flotilla_actors::protocol::{
    Budget, CheckoutSync, EventKind, FixOf, Handoff, Role, Route, RunOutcome, TaskId, TaskSpec,
    Usage, Usd,
};

use flotilla_actors::config::Limits;
use flotilla_actors::graph::RunGraph;

use super::*;
use crate::cli::render::events::event_line;
use crate::cli::render::style::Style;
use crate::cli::render::test_support::*;

/// Issue 20: the live line printed an agent's activity raw (OSC retitle, clear screen,
/// U+202E reached the terminal). The bytes it writes hold no ESC, C1 or bidi control
/// but flotilla's own colour codes.
#[test]
fn the_live_line_escapes_agent_activity() {
    let mut live = LiveLine::default();
    live.observe(&event(
        3,
        1_000,
        EventKind::AgentActivity {
            task: TaskId::root(1),
            attempt: 1,
            activity: format!("run_command {HOSTILE}\u{e0041}\u{ad}"),
        },
    ));
    for columns in [None, Some(400)] {
        let line = live.live_line(1_000, columns);
        assert_safe(&line, false);
        let painted = Style {
            color: true,
            live: true,
        }
        .dim(&line);
        let bytes = format!("\r\x1b[2K{painted}");
        let ours = bytes
            .replacen("\r\x1b[2K", "", 1)
            .replace("\x1b[2m", "")
            .replace("\x1b[0m", "");
        assert!(
            !ours.chars().any(|c| c == '\x1b'
                || ('\u{80}'..='\u{9f}').contains(&c)
                || ('\u{202a}'..='\u{202e}').contains(&c)
                || ('\u{2066}'..='\u{2069}').contains(&c)),
            "{ours:?}"
        );
    }
}

/// M8c: the live line was 146 characters with no regard for the terminal's width; on a
/// terminal it fits in one row, counting wide characters as two columns.
#[test]
fn the_live_line_fits_the_terminals_width() {
    let mut live = LiveLine::default();
    live.set_budget(Budget::new(
        2_000_000,
        Usd::from_micros(5_000_000),
        3_600_000,
    ));
    live.observe(&event(
        1,
        1_000,
        EventKind::AgentActivity {
            task: TaskId::root(1),
            attempt: 1,
            activity: "editing 日本語のファイル src/some/long/path/name.rs".into(),
        },
    ));
    let whole = live.live_line(1_000, None);
    assert!(whole.chars().count() > 100, "{whole}");
    for columns in [0, 1, 2, 10, 40, 80, 120] {
        let line = live.live_line(1_000, Some(columns));
        let width = unicode_width::UnicodeWidthStr::width(line.as_str());
        assert!(width < columns.max(1), "{columns}: {width} columns: {line}");
        if columns > 2 {
            assert!(line.ends_with('…'), "{line}");
        }
    }
    assert_eq!(
        live.live_line(1_000, Some(1_000)),
        whole,
        "room enough: whole"
    );
    assert_eq!(fit_columns("日本語", 6), "日本…");
    assert_eq!(fit_columns("日本語", 7), "日本語");
}

#[test]
fn the_live_line_shows_a_streaming_call_until_its_answer_and_no_tail_line_is_printed_for_it() {
    let mut live = LiveLine::default();
    let progress = event(
        0,
        1_000,
        EventKind::LlmProgress {
            role: Role::Planner,
            task: None,
            tokens_out: 340,
        },
    );
    live.observe(&progress);
    assert!(
        live.summary(1_000)
            .ends_with(" · planner: 340 tokens streaming"),
        "{}",
        live.summary(1_000)
    );
    live.observe(&event(
        1,
        1_100,
        EventKind::PlannerResponded {
            call: 0,
            prompt: String::new(),
            content: String::new(),
            usage: Usage::default(),
            error: None,
        },
    ));
    assert!(!live.summary(1_100).contains("streaming"));
    let line = event_line(&progress, &Style::plain());
    assert!(
        line.contains("#-     planner call streaming: 340 tokens so far"),
        "{line}"
    );
}

/// `count` tasks added and planning finished, with `running` dispatched to a worker and
/// started: the events a run's graph journals for that, as a live line folds them.
fn running_tasks(count: u32, running: &TaskId) -> Vec<EventKind> {
    let mut graph = RunGraph::new(Limits::default());
    let specs = (1..=count)
        .map(|n| TaskSpec::new(format!("task {n}"), &[&format!("src/{n}")]))
        .collect();
    let mut kinds = graph.submit(specs).unwrap();
    kinds.extend(graph.planning_finished().unwrap());
    kinds.extend(graph.dispatched(running, 1, "w", Route::Worker).unwrap());
    kinds.extend(graph.started(running, 1).unwrap());
    kinds
}

#[test]
fn the_subplanners_calls_count_in_what_the_run_spent_as_status_counts_them() {
    let mut live = LiveLine::default();
    let mut kinds = running_tasks(4, &TaskId::root(4));
    kinds.push(EventKind::SubplannerResponded {
        task: TaskId::root(4),
        attempt: 1,
        call: 0,
        prompt: String::new(),
        content: String::new(),
        usage: Usage {
            tokens_in: 1_000,
            tokens_out: 332,
            cost_usd: Usd::from_micros(3_000),
        },
        reported: Vec::new(),
        error: None,
    });
    for (seq, kind) in (1..).zip(kinds) {
        live.observe(&event(seq, 1_000, kind));
    }
    assert!(
        live.summary(1_000).contains("1332 tokens · $0.0030"),
        "{}",
        live.summary(1_000)
    );
    assert!(
        live.summary(1_000)
            .starts_with("0 done · 1 running · 3 pending · 0 failed/cancelled"),
        "{}",
        live.summary(1_000)
    );
}

#[test]
fn the_last_line_says_what_reached_main_the_fixes_and_the_sweeps() {
    let mut live = LiveLine::default();
    assert_eq!(
        live.landing_summary(),
        None,
        "nothing landed, nothing to say"
    );
    let (t1, f1, f2) = (TaskId::root(1), TaskId::fix(1), TaskId::fix(2));
    let moved = |from: &str, to: &str, task: &TaskId| EventKind::MainMoved {
        from: from.into(),
        to: to.into(),
        tasks: vec![task.clone()],
        checkout: CheckoutSync::FastForwarded,
    };
    let sweep = |green: bool| EventKind::SweepFinished {
        report: flotilla_actors::protocol::SweepReport {
            sweep: 1,
            commit: "c".into(),
            green,
            class: None,
            failures: 0,
            fixes: Vec::new(),
            duration_ms: 1,
            finalization: None,
            wording: None,
        },
    };
    let landed = |task: &TaskId| EventKind::TaskLanded {
        task: task.clone(),
        commit: "c".into(),
        via: None,
    };
    let fix = |task: &TaskId, fix: FixOf| EventKind::FixTaskAdded {
        task: task.clone(),
        spec: TaskSpec::new("fix", &["a"]),
        budget: Budget::default(),
        fix,
    };
    for (seq, kind) in [
        moved("aaaaaaa111", "bbbbbbb222", &t1),
        landed(&t1),
        fix(
            &f1,
            FixOf::Conflict {
                task: t1.clone(),
                branch: "b".into(),
                files: vec!["a".into()],
            },
        ),
        sweep(false),
        fix(
            &f2,
            FixOf::Sweep {
                signature: "s".into(),
                class: "build failure".into(),
            },
        ),
        moved("bbbbbbb222", "ccccccc333", &f2),
        landed(&f2),
        sweep(true),
    ]
    .into_iter()
    .enumerate()
    {
        live.observe(&event(seq as u64 + 1, 1_000, kind));
    }
    assert_eq!(
        live.landing_summary().as_deref(),
        Some(
            "main aaaaaaa → ccccccc in 2 moves · 2 tasks landed · fix tasks: 1 for \
             conflicts, 1 for a red main · 2 sweeps, the last green"
        )
    );
}

#[test]
fn the_live_line_counts_every_charge_once_and_stops_its_clock_with_the_run() {
    let t1 = TaskId::root(1);
    let mut handoff = Handoff::complete("done");
    handoff.metrics.tokens_in = 700;
    let mut live = LiveLine::default();
    let mut events = vec![
        event(
            1,
            1_000,
            EventKind::RunStarted {
                request: "r".into(),
                sandbox: None,
            },
        ),
        event(
            2,
            1_010,
            EventKind::PlannerResponded {
                call: 0,
                prompt: String::new(),
                content: String::new(),
                usage: Usage {
                    tokens_in: 60,
                    tokens_out: 40,
                    cost_usd: Usd::from_micros(1_000),
                },
                error: None,
            },
        ),
    ];
    // t1 added, ready, dispatched and started: the events the graph journals for that.
    for kind in running_tasks(1, &t1) {
        let seq = events.len() as u64 + 1;
        events.push(event(seq, 1_020, kind));
    }
    let next = events.len() as u64;
    events.extend([
        event(
            next + 1,
            1_050,
            EventKind::SpendCharged {
                task: t1.clone(),
                attempt: 1,
                spent: Budget::new(500, Usd::from_micros(2_000), 30),
            },
        ),
        // Its handoff's spend was charged above: not counted again.
        event(
            next + 2,
            1_060,
            EventKind::TaskCompleted {
                task: t1,
                attempt: 1,
                handoff: Some(handoff),
                artifacts: vec![],
            },
        ),
        event(
            next + 3,
            1_100,
            EventKind::RunFinished {
                outcome: RunOutcome::Completed,
                reason: None,
            },
        ),
    ]);
    for e in &events {
        live.observe(e);
    }
    // Minutes later, the run still took 0.1 s.
    let line = live.summary(450_000);
    assert!(
        line.starts_with("1 done · 0 running · 0 pending · 0 failed/cancelled"),
        "{line}"
    );
    assert!(
        line.ends_with("600 tokens · $0.0030 · 0.0s agent time · 0.1s elapsed"),
        "{line}"
    );
    live.set_budget(Budget::new(10_000, Usd::from_micros(1_000_000), 60_000));
    // Created before the first event this tail saw: counted from its creation.
    live.set_created(500);
    let line = live.summary(450_000);
    assert!(
        line.ends_with("600/10000 tokens · $0.0030/$1.0000 · 0.0s/1m00s agent time · 0.6s elapsed"),
        "{line}"
    );
}
