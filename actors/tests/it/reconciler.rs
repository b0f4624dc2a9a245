//! The Reconciler actor with in-memory fakes in place of git, main's ref and the process
//! runner, on virtual time: when it sweeps (adaptive interval, debounce after main moved,
//! at once for a finalization round), that a sweep whose main moved is discarded and redone,
//! and that sweeps never overlap.
//!
//! Time only moves when every task is idle (`virtual_time`), and the tests move it by
//! sleeping: each timer then fires at its own deadline, in order.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use flotilla_actors::actors::{FixWriter, Reconciler, ReconcilerConfig, ReconcilerKit};
use flotilla_actors::ports::*;
use flotilla_actors::protocol::*;
use futures::future::BoxFuture;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::harness::{Inbox, probe, virtual_time};

/// What a red command prints: the generic `file:line: message` format.
const RED_OUTPUT: &str = "lib/x.sh:3: error: undefined function foo\n";

fn not_used<T: Send + 'static>(what: &str) -> BoxFuture<'static, Result<T, RepoError>> {
    let e = RepoError::Git(format!("{what}: the Reconciler does not call this"));
    Box::pin(async move { Err(e) })
}

/// main's ref: each `main_tip` takes the next tip of the script; the last one stays.
#[derive(Clone, Default)]
struct FakeMain(Arc<Mutex<VecDeque<String>>>);

impl FakeMain {
    fn script(&self, tips: &[&str]) {
        *self.0.lock().unwrap() = tips.iter().map(|t| t.to_string()).collect();
    }
}

impl RepoReader for FakeMain {
    fn main_tip(&self) -> BoxFuture<'static, Result<String, RepoError>> {
        let mut tips = self.0.lock().unwrap();
        let tip = if tips.len() > 1 {
            tips.pop_front()
        } else {
            tips.front().cloned()
        };
        Box::pin(async move { tip.ok_or_else(|| RepoError::Git("no main".into())) })
    }

    fn snapshot(&self) -> BoxFuture<'static, Result<RepoSnapshot, RepoError>> {
        not_used("snapshot")
    }

    fn changed_paths(
        &self,
        _: String,
        _: String,
    ) -> BoxFuture<'static, Result<Vec<String>, RepoError>> {
        not_used("changed_paths")
    }

    fn read_path(
        &self,
        _: String,
        _: TreePath,
        _: ReadBounds,
    ) -> BoxFuture<'static, Result<TreeItem, RepoError>> {
        not_used("read_path")
    }

    fn grep(&self, _: String, _: GrepQuery) -> BoxFuture<'static, Result<GrepReport, RepoError>> {
        not_used("grep")
    }

    fn log(
        &self,
        _: String,
        _: Option<TreePath>,
        _: usize,
    ) -> BoxFuture<'static, Result<CommitLog, RepoError>> {
        not_used("log")
    }

    fn show_commit(
        &self,
        _: String,
        _: String,
        _: usize,
    ) -> BoxFuture<'static, Result<Option<CommitShown>, RepoError>> {
        not_used("show_commit")
    }
}

#[derive(Default)]
struct GitState {
    /// The commit of every scratch checkout made, in order.
    scratched: Vec<String>,
    /// Scratch checkouts made and not removed yet.
    open: usize,
}

/// Scratch checkouts that are only names (the fake runner never looks at them), and no
/// conflict markers.
#[derive(Clone, Default)]
struct FakeGit(Arc<Mutex<GitState>>);

impl FakeGit {
    fn scratched(&self) -> Vec<String> {
        self.0.lock().unwrap().scratched.clone()
    }

    fn open(&self) -> usize {
        self.0.lock().unwrap().open
    }
}

impl MergeGit for FakeGit {
    fn build(
        &self,
        _: String,
        _: Vec<LandItem>,
        _: LandMode,
    ) -> BoxFuture<'static, Result<BuildOutcome, RepoError>> {
        not_used("build")
    }

    fn contains(&self, _: String, _: String) -> BoxFuture<'static, Result<bool, RepoError>> {
        not_used("contains")
    }

    fn find_on_main(
        &self,
        _: String,
        _: Vec<Vec<String>>,
    ) -> BoxFuture<'static, Result<Vec<Option<String>>, RepoError>> {
        not_used("find_on_main")
    }

    fn scratch(
        &self,
        commit: String,
        label: String,
    ) -> BoxFuture<'static, Result<ScratchTree, RepoError>> {
        let mut state = self.0.lock().unwrap();
        state.scratched.push(commit.clone());
        state.open += 1;
        let path = PathBuf::from("/nonexistent/scratch").join(label);
        Box::pin(async move { Ok(ScratchTree { path, commit }) })
    }

    fn remove_scratch(&self, _: ScratchTree) -> BoxFuture<'static, Result<(), RepoError>> {
        self.0.lock().unwrap().open -= 1;
        Box::pin(async { Ok(()) })
    }

    fn conflict_markers(
        &self,
        _: String,
        _: Option<Vec<String>>,
    ) -> BoxFuture<'static, Result<Vec<MarkerHit>, RepoError>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    fn delete_branch(&self, _: String) -> BoxFuture<'static, Result<(), RepoError>> {
        not_used("delete_branch")
    }

    fn sync_checkout(
        &self,
        _: String,
        _: String,
    ) -> BoxFuture<'static, Result<CheckoutSync, RepoError>> {
        not_used("sync_checkout")
    }
}

#[derive(Default)]
struct RunnerState {
    /// Commands fail (exit 1, [`RED_OUTPUT`]) rather than pass.
    red: bool,
    /// Virtual time each command takes.
    hold: Duration,
    /// Commands run past their time limit, printing nothing.
    time_out: bool,
    /// When each command started, and its shell line.
    calls: Vec<(Instant, String)>,
    running: usize,
    max_running: usize,
}

/// Commands that pass or fail as the test says, take `hold` of virtual time, and are
/// counted.
#[derive(Clone, Default)]
struct FakeRunner(Arc<Mutex<RunnerState>>);

impl FakeRunner {
    fn set_red(&self, red: bool) {
        self.0.lock().unwrap().red = red;
    }

    fn set_time_out(&self, time_out: bool) {
        self.0.lock().unwrap().time_out = time_out;
    }

    fn set_hold(&self, hold: Duration) {
        self.0.lock().unwrap().hold = hold;
    }

    fn calls(&self) -> Vec<(Instant, String)> {
        self.0.lock().unwrap().calls.clone()
    }

    fn max_running(&self) -> usize {
        self.0.lock().unwrap().max_running
    }
}

impl ProcessRunner for FakeRunner {
    fn run(
        &self,
        command: CommandSpec,
        _: CancellationToken,
        _: Option<LineSink>,
    ) -> BoxFuture<'static, Result<CommandOutput, ProcessError>> {
        let state = self.0.clone();
        Box::pin(async move {
            let (red, hold) = {
                let mut s = state.lock().unwrap();
                s.calls.push((
                    Instant::now(),
                    command.args.last().cloned().unwrap_or_default(),
                ));
                s.running += 1;
                s.max_running = s.max_running.max(s.running);
                (s.red, s.hold)
            };
            if !hold.is_zero() {
                tokio::time::sleep(hold).await;
            }
            let time_out = {
                let mut s = state.lock().unwrap();
                s.running -= 1;
                s.time_out
            };
            let text = if time_out {
                ""
            } else if red {
                RED_OUTPUT
            } else {
                "ok\n"
            };
            Ok(CommandOutput {
                exit: if time_out {
                    Exit::TimedOut
                } else {
                    Exit::Code {
                        code: i32::from(red),
                    }
                },
                stdout: Captured {
                    text: text.into(),
                    total_bytes: text.len() as u64,
                    cut_bytes: 0,
                },
                stderr: Captured::default(),
                elapsed: hold,
            })
        })
    }
}

/// A Reconciler on fakes, with a probe in the TaskGraph's place.
struct Sweeps {
    /// When the Reconciler started: every time in these tests is counted from it.
    t0: Instant,
    reconciler: Addr<Reconciler>,
    graph: Inbox<FromMerging>,
    main: FakeMain,
    git: FakeGit,
    runner: FakeRunner,
}

impl Sweeps {
    fn start(config: ReconcilerConfig) -> Self {
        Self::start_with(config, None)
    }

    /// With the `reconciler` role's model wording the fixes.
    fn start_with(config: ReconcilerConfig, writer: Option<FixWriter>) -> Self {
        virtual_time();
        config.validate().unwrap();
        let main = FakeMain::default();
        main.script(&["c0ffee1"]);
        let git = FakeGit::default();
        let runner = FakeRunner::default();
        let (graph_addr, graph) = probe::<FromMerging>("graph");
        let kit = ReconcilerKit {
            git: Arc::new(git.clone()),
            reader: Arc::new(main.clone()),
            runner: Arc::new(runner.clone()),
            config,
            max_fixes: 5,
        };
        let t0 = Instant::now();
        let mut reconciler = Reconciler::new(RunId::generate(), kit, graph_addr);
        if let Some(writer) = writer {
            reconciler = reconciler.with_writer(writer);
        }
        let reconciler = reconciler.start();
        Sweeps {
            t0,
            reconciler,
            graph,
            main,
            git,
            runner,
        }
    }

    fn at(&self, secs: u64) -> Instant {
        self.t0 + Duration::from_secs(secs)
    }

    /// Lets virtual time run to `secs` after the start.
    async fn sleep_until(&self, secs: u64) {
        tokio::time::sleep_until(self.at(secs)).await;
    }

    /// The next message must be a sweep report.
    async fn swept(&mut self) -> SweepReport {
        match self.graph.expect().await {
            FromMerging::Swept(report) => *report,
            other => panic!("expected a sweep report, got {other:?}"),
        }
    }

    /// Nothing reaches the graph until a second before `secs`; then a sweep report arrives,
    /// at `secs`.
    async fn swept_at(&mut self, secs: u64) -> SweepReport {
        self.sleep_until(secs - 1).await;
        self.graph.expect_none().await;
        let report = self.swept().await;
        assert_at(self.t0, Instant::now(), secs, "the sweep report");
        report
    }

    /// When each command ran, in seconds after the start.
    fn command_times(&self) -> Vec<u64> {
        self.runner
            .calls()
            .iter()
            .map(|(t, _)| secs_after(self.t0, *t))
            .collect()
    }
}

/// Whole seconds from `t0` to `t`. tokio's timer wheel rounds each deadline up to the next
/// millisecond, so a chain of timers drifts by a millisecond or so per timer; every time in
/// these tests is a whole number of seconds, so anything within 100 ms of one is that one.
fn secs_after(t0: Instant, t: Instant) -> u64 {
    let elapsed = t - t0;
    let secs = (elapsed + Duration::from_millis(500)).as_secs();
    let off = elapsed.abs_diff(Duration::from_secs(secs));
    assert!(
        off < Duration::from_millis(100),
        "{elapsed:?} after the start is not on a whole second"
    );
    secs
}

fn assert_at(t0: Instant, t: Instant, secs: u64, what: &str) {
    assert_eq!(
        secs_after(t0, t),
        secs,
        "{what} came {:?} after the start",
        t - t0
    );
}

fn config(test: &str) -> ReconcilerConfig {
    ReconcilerConfig {
        test: Some(test.into()),
        ..ReconcilerConfig::default()
    }
}

#[actix::test]
async fn adaptive_interval_on_virtual_time() {
    let mut h = Sweeps::start(ReconcilerConfig {
        interval_secs: 300,
        red_interval_secs: 60,
        green_streak: 3,
        debounce_secs: 10_000,
        ..config("run-tests")
    });

    // Green: the first sweep comes after the slow interval, not a second earlier.
    let first = h.swept_at(300).await;
    assert!(first.green, "{first:?}");
    assert_eq!((first.sweep, first.commit.as_str()), (1, "c0ffee1"));
    assert_eq!(first.finalization, None);

    // main turns red: the next sweep (still on the slow interval) finds it, and from then on
    // sweeps come every minute.
    h.runner.set_red(true);
    for (at, number) in [(600, 2), (660, 3), (720, 4)] {
        let report = h.swept_at(at).await;
        assert!(!report.green, "sweep at {at} s: {report:?}");
        assert_eq!(report.sweep, number);
    }

    // Green again: still every minute until three green sweeps in a row...
    h.runner.set_red(false);
    for (at, number) in [(780, 5), (840, 6), (900, 7)] {
        let report = h.swept_at(at).await;
        assert!(report.green, "sweep at {at} s: {report:?}");
        assert_eq!(report.sweep, number);
    }
    // ...then back to the slow interval: nothing at 960 s, the next sweep at 1200 s.
    let report = h.swept_at(1_200).await;
    assert!(report.green);
    assert_eq!(report.sweep, 8);

    assert_eq!(
        h.command_times(),
        [300, 600, 660, 720, 780, 840, 900, 1_200],
        "one command per sweep, when the sweep starts"
    );
    assert_eq!(h.git.open(), 0, "every scratch checkout is removed");
}

#[actix::test]
async fn main_moved_triggers_one_debounced_sweep() {
    let mut h = Sweeps::start(ReconcilerConfig {
        debounce_secs: 5,
        interval_secs: 300,
        ..config("run-tests")
    });

    for second in 0..3 {
        h.sleep_until(second).await;
        h.reconciler.do_send(ToReconciler::MainMoved {
            tip: format!("tip-{second}"),
        });
    }
    // One sweep for the three moves, `debounce_secs` after the first.
    let report = h.swept_at(5).await;
    assert_eq!(report.sweep, 1);
    h.graph.expect_none().await;
    assert_eq!(h.command_times(), [5]);

    // The interval restarts from that sweep: the timer set for 300 s is superseded.
    let report = h.swept_at(305).await;
    assert_eq!(report.sweep, 2);
    assert_eq!(h.command_times(), [5, 305]);

    // A move after the debounce ended starts a new one.
    h.reconciler.do_send(ToReconciler::MainMoved {
        tip: "later".into(),
    });
    let report = h.swept_at(310).await;
    assert_eq!(report.sweep, 3);
}

#[actix::test]
async fn a_sweep_whose_main_moved_is_discarded_as_stale_and_redone() {
    let mut h = Sweeps::start(config("run-tests"));
    // main is at A when the sweep starts and at B when its commands are done.
    h.main.script(&["aaaaaaa", "bbbbbbb"]);
    h.reconciler.do_send(ToReconciler::Finalize {
        attempt: 1,
        commit: None,
    });

    match h.graph.expect().await {
        FromMerging::SweepStale { sweep, commit } => {
            assert_eq!((sweep, commit.as_str()), (1, "aaaaaaa"));
        }
        other => panic!("expected the sweep of A to be stale, got {other:?}"),
    }
    // The redo sweeps B, at once, and answers the finalization round the stale one could
    // not.
    let report = h.swept().await;
    assert_eq!((report.sweep, report.commit.as_str()), (2, "bbbbbbb"));
    assert!(report.green);
    assert_eq!(report.finalization, Some(1));
    assert_eq!(Instant::now(), h.t0, "no timer was waited for");

    // Never a report for A.
    h.graph.expect_none().await;
    assert_eq!(h.git.scratched(), ["aaaaaaa", "bbbbbbb"]);
    assert_eq!(h.git.open(), 0, "the stale sweep's checkout is removed too");
}

#[actix::test]
async fn finalize_sweeps_at_once_and_carries_the_attempt() {
    let mut h = Sweeps::start(config("run-tests"));
    h.runner.set_red(true);
    h.reconciler.do_send(ToReconciler::Finalize {
        attempt: 2,
        commit: None,
    });

    let report = h.swept().await;
    assert_eq!(Instant::now(), h.t0, "the sweep waited for no interval");
    assert_eq!(report.finalization, Some(2));
    assert_eq!(report.sweep, 1);
    assert!(!report.green);
    assert_eq!(report.failures, 1);
    assert_eq!(report.class.as_deref(), Some("test failure"));
    assert_eq!(report.fixes.len(), 1, "{report:?}");
    let fix = &report.fixes[0];
    assert_eq!(fix.class, "test failure");
    assert_eq!(fix.scope, ["lib/x.sh"]);
    assert!(
        fix.description.contains("undefined function foo"),
        "{}",
        fix.description
    );
    assert!(fix.signature.starts_with("test-"), "{}", fix.signature);

    // The next sweep is a scheduled one (main is red: a minute later) and answers no
    // finalization round.
    let report = h.swept_at(60).await;
    assert_eq!(report.finalization, None);
    assert_eq!(report.sweep, 2);
    assert!(!report.green);
}

#[actix::test]
async fn sweeps_never_overlap() {
    let mut h = Sweeps::start(ReconcilerConfig {
        build: Some("build".into()),
        interval_secs: 250,
        debounce_secs: 5,
        ..config("run-tests")
    });
    // Each command takes 100 s: a sweep takes 200 s.
    h.runner.set_hold(Duration::from_secs(100));

    // A finalization round starts sweep 1 at 200 s (it ends at 400 s)...
    h.sleep_until(200).await;
    h.reconciler.do_send(ToReconciler::Finalize {
        attempt: 1,
        commit: None,
    });
    // ...while it runs, the interval timer set for 250 s is superseded (the sweep's start
    // cancels it), and main moves (300 s, debounced to 305 s).
    h.sleep_until(300).await;
    h.reconciler.do_send(ToReconciler::MainMoved {
        tip: "moved".into(),
    });

    let first = h.swept_at(400).await;
    assert_eq!((first.sweep, first.finalization), (1, Some(1)));
    // What was asked for while it ran is one more sweep, right after it (400 s to 600 s).
    let second = h.swept_at(600).await;
    assert_eq!((second.sweep, second.finalization), (2, None));
    // Then the interval, counted from the end of the second sweep: the third starts at
    // 850 s (the timer set when the first ended, for 650 s, is superseded) and reports at
    // 1050 s.
    let third = h.swept_at(1_050).await;
    assert_eq!((third.sweep, third.finalization), (3, None));
    assert_eq!(h.runner.max_running(), 1, "never two commands at once");
    assert_eq!(
        h.command_times(),
        [200, 300, 400, 500, 850, 950],
        "each sweep's commands run one after the other, and sweeps back to back"
    );
}

#[actix::test]
async fn a_finalization_whose_sweep_cannot_read_main_is_swept_again_on_the_short_interval() {
    let mut h = Sweeps::start(config("run-tests"));
    // main cannot be read when the finalization round asks for its sweep...
    h.main.script(&[]);
    h.reconciler.do_send(ToReconciler::Finalize {
        attempt: 1,
        commit: None,
    });
    h.sleep_until(1).await;
    h.main.script(&["c0ffee1"]);
    // ...so the round is swept again after the red interval (60 s), not the green one
    // (300 s), and the report still answers it.
    let report = h.swept_at(60).await;
    assert_eq!((report.finalization, report.green), (Some(1), true));
    assert_eq!(
        h.command_times(),
        [60],
        "the unreadable sweep ran no command"
    );
}

/// Issue 20: a sweep command killed at its time limit was recorded as "failed without
/// printing anything"; it says it timed out, and after how long.
#[actix::test]
async fn a_sweep_command_that_timed_out_says_so() {
    let mut h = Sweeps::start(ReconcilerConfig {
        timeout_secs: 42,
        ..config("run-tests")
    });
    h.runner.set_time_out(true);
    h.reconciler.do_send(ToReconciler::Finalize {
        attempt: 1,
        commit: None,
    });
    let report = h.swept().await;
    assert!(!report.green);
    assert_eq!(report.failures, 1);
    let description = &report.fixes[0].description;
    assert!(
        description.contains("`run-tests` timed out after 42 s"),
        "{description}"
    );
    assert!(!description.contains("without printing"), "{description}");
}

#[actix::test]
async fn a_finalization_sweeps_what_the_run_landed_even_while_main_moves_on() {
    let mut h = Sweeps::start(config("run-tests"));
    // Another run keeps moving main: every read of it gives a new tip.
    h.main
        .script(&["0ther01", "0ther02", "0ther03", "0ther04", "0ther05"]);
    h.reconciler.do_send(ToReconciler::Finalize {
        attempt: 1,
        commit: Some("a1a1a1a".into()),
    });
    let report = h.swept().await;
    assert_eq!(report.commit, "a1a1a1a", "the commit this run last landed");
    assert_eq!((report.finalization, report.green), (Some(1), true));
}

/// What the fake `reconciler` model answers, call by call.
enum Says {
    /// One wording per fix task the request numbers.
    Words,
    Garbage,
    Fails,
}

/// The `reconciler` role's model: answers as scripted and records each request.
#[derive(Clone, Default)]
struct FakeModel(Arc<Mutex<(VecDeque<Says>, Vec<LlmRequest>)>>);

impl Llm for FakeModel {
    fn complete(
        &self,
        request: LlmRequest,
        _: LlmCall,
    ) -> BoxFuture<'static, Result<LlmResponse, LlmError>> {
        let fixes = request.messages[1].content.matches("## Fix task").count();
        let says = {
            let mut state = self.0.lock().unwrap();
            state.1.push(request);
            state.0.pop_front().unwrap_or(Says::Garbage)
        };
        let answer = match says {
            Says::Words => {
                let tasks: Vec<serde_json::Value> = (0..fixes)
                    .map(|i| {
                        serde_json::json!({
                            "description": format!("Define foo in lib/x.sh (fix {i})\u{1b}[2J"),
                            "acceptance": "`run-tests` exits 0",
                            "scope": ["/etc/passwd"],
                        })
                    })
                    .collect();
                Ok(serde_json::json!({"scratchpad": "red", "tasks": tasks}).to_string())
            }
            Says::Garbage => Ok("Sure! Here are some ideas.".to_string()),
            Says::Fails => Err(LlmError::Server {
                status: 500,
                message: "down".into(),
            }),
        };
        Box::pin(async move {
            answer.map(|content| LlmResponse {
                content,
                usage: Usage {
                    tokens_in: 100,
                    tokens_out: 20,
                    cost_usd: Usd::ZERO,
                },
                ..LlmResponse::default()
            })
        })
    }
}

/// ADR-032: with a `reconciler` model, a red sweep's fixes carry its words (cleaned, its
/// scope ignored) and the call's cost; garbage or a failed call leaves flotilla's wording,
/// with the reason; the call runs inside the sweep, never blocking the actor (the next
/// sweeps come on time); a green sweep asks nothing.
#[actix::test]
async fn the_reconciler_model_words_fixes_and_garbage_or_failure_falls_back() {
    let model = FakeModel::default();
    model
        .0
        .lock()
        .unwrap()
        .0
        .extend([Says::Words, Says::Garbage, Says::Fails]);
    let writer = FixWriter {
        llm: Arc::new(model.clone()),
        system: "You are the reconciler.".into(),
    };
    let mut h = Sweeps::start_with(
        ReconcilerConfig {
            interval_secs: 60,
            red_interval_secs: 60,
            debounce_secs: 10_000,
            ..config("run-tests")
        },
        Some(writer),
    );
    let green = h.swept_at(60).await;
    assert!(green.green && green.wording.is_none(), "{green:?}");
    h.runner.set_red(true);

    let worded = h.swept_at(120).await;
    assert!(!worded.green && !worded.fixes.is_empty(), "{worded:?}");
    let call = worded.wording.clone().unwrap();
    assert_eq!(call.fallback, None);
    assert_eq!(call.usage.tokens_in + call.usage.tokens_out, 120);
    for (i, fix) in worded.fixes.iter().enumerate() {
        let words = fix.worded.as_ref().unwrap();
        assert_eq!(
            words.description,
            format!("Define foo in lib/x.sh (fix {i})[2J"),
            "control characters are gone"
        );
        assert_eq!(words.acceptance, "`run-tests` exits 0");
        assert!(
            !fix.scope.iter().any(|p| p.contains("passwd")),
            "scope is flotilla's"
        );
    }

    let garbage = h.swept_at(180).await;
    assert!(garbage.fixes.iter().all(|f| f.worded.is_none()));
    let fallback = garbage.wording.unwrap().fallback.unwrap();
    assert!(fallback.contains("unusable"), "{fallback}");
    assert_eq!(
        garbage.fixes,
        worded
            .fixes
            .iter()
            .cloned()
            .map(|mut f| {
                f.worded = None;
                f
            })
            .collect::<Vec<_>>()
    );

    let failed = h.swept_at(240).await;
    let fallback = failed.wording.unwrap().fallback.unwrap();
    assert!(fallback.contains("model failed"), "{fallback}");
    assert!(failed.fixes.iter().all(|f| f.worded.is_none()));

    let asked = model.0.lock().unwrap().1.clone();
    assert_eq!(
        asked.len(),
        3,
        "asked once per red sweep, never for a green one"
    );
    assert_eq!(asked[0].role, Role::Reconciler);
    assert_eq!(asked[0].messages[0].content, "You are the reconciler.");
    assert!(
        asked[0].messages[1]
            .content
            .contains("undefined function foo"),
        "{}",
        asked[0].messages[1].content
    );
}
