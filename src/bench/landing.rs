//! `flotilla bench --landing`: the path a real task takes, through a real daemon. N tasks
//! whose scripted agents each write one file of their own, so every task makes a
//! workspace, a commit and a landing through the run's MergeQueue (and its gate, if one is
//! given), on a generated repository of 1k to 50k files ([`super::landing_repo`]).
//!
//! This module holds what the measurement is: the case, the run's config, the clock that
//! reads the run's events, the daemon process's CPU, peak RSS and the disk it used. The
//! driver that starts the daemon and talks to it is the CLI's (`cli/commands/bench_landing`),
//! since the HTTP client is there.
//!
//! Times come from the events' journal timestamps (milliseconds): dispatch → landed is
//! from a task's first `task_dispatched` to its `task_landed`; started → landing from its
//! first `task_started` to its `task_landing` (the worker's part: workspace, agent, seal).
//! The phases around it are reported too: ready → dispatched (first `task_ready` to first
//! `task_dispatched`: the wait for a worker slot, outside dispatch → landed), dispatched → started (first `task_dispatched`
//! to first `task_started`: the hand-off to a worker) and landing → landed (first
//! `task_landing` to `task_landed`: the wait in the merge queue and its landing).

use std::collections::HashMap;
use std::path::Path;

use flotilla_actors::protocol::{Event, EventKind, RunOutcome, TaskId};

use crate::config::RunConfig;
use crate::scripted::{AgentStep, PlannerScript, PlannerStep, Scenario, TaskScript};

/// Tasks per planner answer, as a planner's sprints would come.
const SPRINT: usize = 50;

/// One landing measurement.
#[derive(Debug, Clone, PartialEq)]
pub struct LandingCase {
    /// Files on main before the run.
    pub files: usize,
    /// Tasks, each landing one new file.
    pub tasks: usize,
    /// Attempts at once (`limits.max_workers`).
    pub workers: usize,
    /// A gate command every candidate must pass; none by default.
    pub gate: Option<String>,
}

/// The file task `n` (1-based) writes: each its own, in a directory of their own.
pub fn task_file(n: usize) -> String {
    format!("bench/t{n}.txt")
}

/// The run's config: the scripted planner answers the tasks in sprints of [`SPRINT`];
/// task `tN`'s agent writes [`task_file`]`(N)` at once (what the run numbered `round` of
/// the repository writes there: a next run's tasks change what the last one landed); node
/// and worker limits fit.
pub fn run_config(case: &LandingCase, round: usize) -> RunConfig {
    let mut scenario = Scenario {
        agent: AgentStep {
            delay_ms: Some(0),
            ..AgentStep::default()
        },
        ..Scenario::default()
    };
    let numbers: Vec<usize> = (1..=case.tasks).collect();
    scenario.planner = PlannerScript {
        answers: numbers
            .chunks(SPRINT)
            .map(|sprint| PlannerStep {
                tasks: Some(
                    sprint
                        .iter()
                        .map(|&n| {
                            serde_json::json!({
                                "description": format!("write {}", task_file(n)),
                                "scope": [task_file(n)],
                            })
                        })
                        .collect(),
                ),
                ..PlannerStep::default()
            })
            .collect(),
    };
    for &n in &numbers {
        let mut step = AgentStep {
            delay_ms: Some(0),
            summary: Some(format!("wrote {}", task_file(n))),
            ..AgentStep::default()
        };
        step.writes
            .insert(task_file(n), format!("the work of task {n}, run {round}\n"));
        scenario.tasks.insert(
            format!("t{n}"),
            TaskScript {
                step,
                ..TaskScript::default()
            },
        );
    }
    let mut config = RunConfig {
        scenario,
        ..RunConfig::default()
    };
    config.limits.max_workers = case.workers.max(1);
    config.limits.max_nodes = case.tasks.saturating_add(64);
    config.merge.gate = case.gate.iter().cloned().collect();
    config
}

/// Each task's moments, in journal milliseconds.
#[derive(Debug, Clone, Copy, Default)]
struct Moments {
    ready: Option<u64>,
    dispatched: Option<u64>,
    started: Option<u64>,
    landing: Option<u64>,
    /// The journaled intent of the landing that moved main with it (ADR-018).
    intended: Option<u64>,
    landed: Option<u64>,
}

/// Reads a run's events as they stream and keeps what the measurement needs.
#[derive(Debug, Default)]
pub struct LandingClock {
    tasks: HashMap<TaskId, Moments>,
    outcome: Option<(RunOutcome, Option<String>)>,
}

impl LandingClock {
    pub fn observe(&mut self, event: &Event) {
        let at = event.at_ms;
        let first = |slot: &mut Option<u64>| {
            slot.get_or_insert(at);
        };
        match &event.kind {
            EventKind::TaskReady { task } => {
                first(&mut self.tasks.entry(task.clone()).or_default().ready)
            }
            EventKind::TaskDispatched { task, .. } => {
                first(&mut self.tasks.entry(task.clone()).or_default().dispatched)
            }
            EventKind::TaskStarted { task, .. } => {
                first(&mut self.tasks.entry(task.clone()).or_default().started)
            }
            EventKind::TaskLanding { task, .. } => {
                first(&mut self.tasks.entry(task.clone()).or_default().landing)
            }
            EventKind::LandingIntended { landed, .. } => {
                for intended in landed {
                    // The last intent: an earlier one's move of main may have raced and failed.
                    self.tasks
                        .entry(intended.task.clone())
                        .or_default()
                        .intended = Some(at);
                }
            }
            EventKind::TaskLanded { task, .. } => {
                first(&mut self.tasks.entry(task.clone()).or_default().landed)
            }
            EventKind::RunFinished { outcome, reason } => {
                self.outcome = Some((*outcome, reason.clone()));
            }
            _ => {}
        }
    }

    /// Whether `run_finished` has been seen.
    pub fn finished(&self) -> bool {
        self.outcome.is_some()
    }

    /// The run's numbers, with what was measured of the daemon process around it.
    pub fn result(
        self,
        case: &LandingCase,
        daemon: DaemonUsage,
    ) -> Result<LandingResult, LandingError> {
        match self.outcome {
            Some((RunOutcome::Completed, _)) => {}
            Some((outcome, reason)) => {
                return Err(LandingError::NotCompleted {
                    outcome,
                    reason: reason.unwrap_or_default(),
                });
            }
            None => return Err(LandingError::Unfinished),
        }
        let landed: Vec<&Moments> = self.tasks.values().filter(|m| m.landed.is_some()).collect();
        if landed.len() != case.tasks {
            return Err(LandingError::NotAllLanded {
                landed: landed.len(),
                tasks: case.tasks,
            });
        }
        let span =
            |from: Option<u64>, to: Option<u64>| from.zip(to).map(|(a, b)| b.saturating_sub(a));
        let mut dispatch_to_landed: Vec<u64> = landed
            .iter()
            .filter_map(|m| span(m.dispatched, m.landed))
            .collect();
        let phase = |from: fn(&Moments) -> Option<u64>, to: fn(&Moments) -> Option<u64>| {
            let mut spans: Vec<u64> = landed.iter().filter_map(|m| span(from(m), to(m))).collect();
            spans.sort_unstable();
            spans
        };
        let ready_to_dispatched = phase(|m| m.ready, |m| m.dispatched);
        let dispatched_to_started = phase(|m| m.dispatched, |m| m.started);
        let started_to_landing = phase(|m| m.started, |m| m.landing);
        let landing_to_landed = phase(|m| m.landing, |m| m.landed);
        let landing_to_intended = phase(|m| m.landing, |m| m.intended);
        let intended_to_landed = phase(|m| m.intended, |m| m.landed);
        dispatch_to_landed.sort_unstable();
        let first = landed.iter().filter_map(|m| m.dispatched).min();
        let last = landed.iter().filter_map(|m| m.landed).max();
        let elapsed_ms = span(first, last).unwrap_or(0);
        Ok(LandingResult {
            landed: landed.len(),
            elapsed_ms,
            dispatch_to_landed_ms: dispatch_to_landed,
            ready_to_dispatched_ms: ready_to_dispatched,
            dispatched_to_started_ms: dispatched_to_started,
            started_to_landing_ms: started_to_landing,
            landing_to_landed_ms: landing_to_landed,
            landing_to_intended_ms: landing_to_intended,
            intended_to_landed_ms: intended_to_landed,
            daemon,
        })
    }
}

/// What the daemon process used during the run.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DaemonUsage {
    /// User + system CPU of the daemon process (not of its children: agents and gates),
    /// from the submission to `run_finished`.
    pub cpu_ms: u64,
    /// The daemon's peak resident set (VmHWM; the daemon is fresh per case).
    pub peak_rss_bytes: Option<u64>,
    /// Bytes under the state directory and the repository's `.git` after the run.
    pub disk_bytes: u64,
}

#[derive(Debug, Clone)]
pub struct LandingResult {
    pub landed: usize,
    /// From the first dispatch to the last landing.
    pub elapsed_ms: u64,
    /// Per landed task, sorted.
    pub dispatch_to_landed_ms: Vec<u64>,
    /// Before dispatch → landed: from a task's first `task_ready` to its first dispatch (the
    /// wait for a worker slot), per landed task, sorted.
    pub ready_to_dispatched_ms: Vec<u64>,
    /// The phases of dispatch → landed, each per landed task, sorted: the hand-off to a
    /// worker, the worker's part, the merge queue's part.
    pub dispatched_to_started_ms: Vec<u64>,
    pub started_to_landing_ms: Vec<u64>,
    pub landing_to_landed_ms: Vec<u64>,
    /// The merge queue's part split at the journaled intent: the wait for a cycle and its
    /// build (and gate), then the move of main, the user's checkout and the branches. Of
    /// the tasks with an intent: all of them here (a task found on main after a crash has
    /// none, and the bench does not crash its daemon).
    pub landing_to_intended_ms: Vec<u64>,
    pub intended_to_landed_ms: Vec<u64>,
    pub daemon: DaemonUsage,
}

impl LandingResult {
    pub fn landed_per_s(&self) -> f64 {
        self.landed as f64 * 1000.0 / (self.elapsed_ms.max(1)) as f64
    }

    pub fn cpu_ms_per_task(&self) -> f64 {
        self.daemon.cpu_ms as f64 / self.landed.max(1) as f64
    }
}

/// Nearest-rank quantile of sorted milliseconds; 0 when there are none.
pub fn quantile_ms(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Why a landing case measured nothing.
#[derive(Debug, thiserror::Error)]
pub enum LandingError {
    #[error("the run ended {outcome:?}, not completed: {reason}")]
    NotCompleted { outcome: RunOutcome, reason: String },
    #[error("the event stream ended before run_finished")]
    Unfinished,
    #[error("{landed} of {tasks} tasks landed")]
    NotAllLanded { landed: usize, tasks: usize },
}

/// User + system CPU of process `pid` so far, in milliseconds (`/proc/PID/stat`); `None`
/// off Linux or once it is gone.
pub fn process_cpu_ms(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 (utime) and 15 (stime) of the whole line are 12 and 13 after the name.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf reads a constant of the system; no pointer is involved.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let ticks = u64::try_from(ticks).ok().filter(|t| *t > 0)?;
    utime
        .checked_add(stime)?
        .checked_mul(1000)
        .map(|ms| ms / ticks)
}

/// Process `pid`'s peak resident set (VmHWM), in bytes.
pub fn process_peak_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
}

/// Bytes of the regular files under `dir` (links not followed; what cannot be read counts
/// as nothing).
pub fn disk_bytes(dir: &Path) -> u64 {
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                total = total.saturating_add(entry.metadata().map_or(0, |m| m.len()));
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_actors::protocol::{IntendedLanding, Route, RunId};

    fn event(at_ms: u64, kind: EventKind) -> Event {
        Event {
            seq: at_ms,
            run: RunId::generate(),
            at_ms,
            kind,
        }
    }

    fn case(tasks: usize) -> LandingCase {
        LandingCase {
            files: 10,
            tasks,
            workers: 2,
            gate: None,
        }
    }

    #[test]
    fn the_config_gives_every_task_a_file_of_its_own_in_sprints() {
        let config = run_config(
            &LandingCase {
                gate: Some("true".into()),
                ..case(120)
            },
            0,
        );
        assert_eq!(config.scenario.planner.answers.len(), 3);
        let listed: usize = config
            .scenario
            .planner
            .answers
            .iter()
            .map(|a| a.tasks.as_ref().map_or(0, Vec::len))
            .sum();
        assert_eq!(listed, 120);
        assert_eq!(
            config.scenario.tasks["t120"]
                .step
                .writes
                .keys()
                .collect::<Vec<_>>(),
            vec!["bench/t120.txt"]
        );
        assert_eq!(config.merge.gate, vec!["true".to_string()]);
        assert!(config.limits.max_nodes >= 120);
        assert_eq!(config.limits.max_workers, 2);
        // What the API takes: the scenario survives the trip through JSON.
        let back: RunConfig =
            serde_json::from_value(serde_json::to_value(&config).unwrap()).unwrap();
        assert_eq!(back.scenario, config.scenario);
    }

    #[test]
    fn the_clock_measures_each_task_from_its_first_dispatch_and_start() {
        let t = |n| TaskId::root(n);
        let mut clock = LandingClock::default();
        let dispatched = |n, attempt| EventKind::TaskDispatched {
            task: t(n),
            attempt,
            profile: "general".into(),
            route: Route::Worker,
        };
        let started = |n, attempt| EventKind::TaskStarted {
            task: t(n),
            attempt,
        };
        let landing = |n| EventKind::TaskLanding {
            task: t(n),
            attempt: 1,
            handoff: None,
            artifacts: Vec::new(),
            branch: format!("b{n}"),
            head: "h".into(),
        };
        let landed = |n| EventKind::TaskLanded {
            task: t(n),
            commit: "c".into(),
            via: None,
        };
        let ready = |n| EventKind::TaskReady { task: t(n) };
        let intended = |tasks: &[u32]| EventKind::LandingIntended {
            from: "a".into(),
            to: "b".into(),
            landed: tasks
                .iter()
                .map(|n| IntendedLanding {
                    task: t(*n),
                    attempt: 1,
                    commit: "c".into(),
                })
                .collect(),
        };
        for e in [
            event(900, ready(1)),
            event(1_000, dispatched(1, 1)),
            event(1_010, started(1, 1)),
            event(1_100, dispatched(1, 2)),
            event(1_110, started(1, 2)),
            event(1_700, ready(2)),
            event(2_000, dispatched(2, 1)),
            event(2_050, started(2, 1)),
            event(1_500, landing(1)),
            event(2_300, landing(2)),
            // Task 1's first intent raced a move of main; the second one landed it.
            event(2_400, intended(&[1, 2])),
            event(2_900, intended(&[1])),
            event(3_000, landed(1)),
            event(3_800, intended(&[2])),
            event(4_000, landed(2)),
        ] {
            clock.observe(&e);
        }
        assert!(!clock.finished());
        clock.observe(&event(
            4_001,
            EventKind::RunFinished {
                outcome: RunOutcome::Completed,
                reason: None,
            },
        ));
        let r = clock.result(&case(2), DaemonUsage::default()).unwrap();
        assert_eq!(r.dispatch_to_landed_ms, vec![2_000, 2_000]);
        assert_eq!(r.ready_to_dispatched_ms, vec![100, 300]);
        assert_eq!(r.dispatched_to_started_ms, vec![10, 50]);
        assert_eq!(r.started_to_landing_ms, vec![250, 490]);
        assert_eq!(r.landing_to_landed_ms, vec![1_500, 1_700]);
        assert_eq!(r.landing_to_intended_ms, vec![1_400, 1_500]);
        assert_eq!(r.intended_to_landed_ms, vec![100, 200]);
        assert_eq!(r.elapsed_ms, 3_000);
        assert!((r.landed_per_s() - 2.0 / 3.0).abs() < 1e-9);
        // A run that landed fewer than its tasks measured nothing.
        let mut short = LandingClock::default();
        short.observe(&event(1, dispatched(1, 1)));
        short.observe(&event(2, landed(1)));
        short.observe(&event(
            3,
            EventKind::RunFinished {
                outcome: RunOutcome::Completed,
                reason: None,
            },
        ));
        assert!(matches!(
            short.result(&case(2), DaemonUsage::default()),
            Err(LandingError::NotAllLanded {
                landed: 1,
                tasks: 2
            })
        ));
    }

    #[test]
    fn this_process_has_a_cpu_time_and_a_peak() {
        let me = std::process::id();
        assert!(process_cpu_ms(me).is_some());
        assert!(process_peak_rss(me).unwrap() > 0);
        assert_eq!(quantile_ms(&[10, 20, 30, 40], 0.5), 20);
        assert_eq!(quantile_ms(&[10, 20, 30, 40], 0.99), 40);
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("a")).unwrap();
        std::fs::write(dir.path().join("a/b"), [0u8; 100]).unwrap();
        std::fs::write(dir.path().join("c"), [0u8; 20]).unwrap();
        assert_eq!(disk_bytes(dir.path()), 120);
    }
}
