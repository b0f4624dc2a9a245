//! Old journals keep reading (issue 21 item 7): `tests/fixtures/journal-m9.sqlite` is a
//! journal written by flotilla as of M9, and a daemon of today must read it to the statuses
//! pinned in `tests/it/snapshots/` — a change to the event encoding, the schema or the
//! replay that breaks old journals fails here.
//!
//! The fixture holds two runs: a real one (a daemon on the scripted provider: three tasks,
//! one of them blocked) and one holding `EventKind::samples` of every stored kind (the
//! awkward values: largest numbers, text to escape). Every row of both must decode; the
//! samples are no coherent run, so that run's status is `damaged` at its first event the
//! graph refuses, and is pinned as such. A kind added later without a new
//! fixture fails `the_fixture_holds_every_stored_event_kind`: append its sample to the
//! fixture's samples run, keeping every M9 row as it was, with
//! `cargo test --test it journal_fixture::append_new_kinds_to_the_fixture -- --ignored`
//! (or regenerate the whole file with `write_the_journal_fixture`), review the snapshots,
//! and commit the file.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use assert_cmd::Command;
use flotilla::journal::{RunRecord, SqliteJournal};
use flotilla_actors::ports::{Journal, SystemClock};
use flotilla_actors::protocol::{EventKind, RunId};

use crate::daemon_env::*;

/// Kinds that are live notices only (seq 0, never journaled): no journal holds them.
const NOTICES: [&str; 5] = [
    "journal_unavailable",
    "storage_unavailable",
    "llm_progress",
    "provider_paused",
    "agent_activity",
];

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/journal-m9.sqlite")
}

/// Every stored kind, by its journal name.
fn stored_kinds() -> BTreeSet<&'static str> {
    EventKind::samples(&"t1".parse().unwrap())
        .iter()
        .map(EventKind::name)
        .filter(|name| !NOTICES.contains(name))
        .collect()
}

const SCENARIO: &str = r#"
[[planner.answers]]
tasks = [
  { description = "write the lexer", scope = ["src/lex.rs"] },
  { description = "write the parser", scope = ["src/parse.rs"], dependencies = [0] },
  { description = "write the docs", scope = ["docs/guide.md"] },
]
[tasks.t3]
outcome = "blocked"
summary = "no style guide"
"#;

#[tokio::test]
#[ignore = "writes tests/fixtures/journal-m9.sqlite; run by hand to regenerate the fixture"]
async fn write_the_journal_fixture() {
    let state = tempfile::tempdir().unwrap();
    let repo = git_repo();
    let daemon = DaemonProcess::start(state.path());
    let client = DaemonProcess::client(state.path());
    let run = submit(&client, repo.path(), run_config(SCENARIO, 2)).await;
    follow_to_end(&client, &run, None).await;
    daemon.kill();

    // The second run: one event of every stored kind, appended as the daemon appends.
    let journal =
        SqliteJournal::open(&state.path().join("journal.sqlite"), Arc::new(SystemClock)).unwrap();
    let real: RunRecord = journal.runs().await.unwrap().remove(0);
    let samples = RunId::generate();
    journal
        .create_run(RunRecord {
            id: samples,
            request: "one event of every stored kind".into(),
            outcome: None,
            ..real
        })
        .await
        .unwrap();
    let kinds: Vec<EventKind> = EventKind::samples(&"t1".parse().unwrap())
        .into_iter()
        .filter(|k| !NOTICES.contains(&k.name()))
        .collect();
    journal.append(samples, kinds).await.unwrap();
    drop(journal);

    let out = fixture();
    let _ = std::fs::remove_file(&out);
    let conn = rusqlite::Connection::open(state.path().join("journal.sqlite")).unwrap();
    conn.execute("VACUUM INTO ?1", [out.to_str().unwrap()])
        .unwrap();
    eprintln!("wrote {} (runs {run} and {samples})", out.display());
}

/// Appends, to the fixture's samples run, a sample of each stored kind it lacks: the rows
/// M9 wrote stay as they were (their encoding is what the fixture tests), the run ids too.
#[tokio::test]
#[ignore = "rewrites tests/fixtures/journal-m9.sqlite; run by hand when a kind is added"]
async fn append_new_kinds_to_the_fixture() {
    let state = tempfile::tempdir().unwrap();
    let copy = state.path().join("journal.sqlite");
    std::fs::copy(fixture(), &copy).unwrap();
    let journal = SqliteJournal::open(&copy, Arc::new(SystemClock)).unwrap();
    let mut held = BTreeSet::new();
    let mut samples_run = None;
    for run in journal.runs().await.unwrap() {
        if run.request == "one event of every stored kind" {
            samples_run = Some(run.id);
        }
        for event in journal.read(run.id, 0).await.unwrap() {
            held.insert(event.kind.name());
        }
    }
    let lacking: Vec<EventKind> = EventKind::samples(&"t1".parse().unwrap())
        .into_iter()
        .filter(|k| !NOTICES.contains(&k.name()) && !held.contains(k.name()))
        .collect();
    eprintln!(
        "appending {:?}",
        lacking.iter().map(EventKind::name).collect::<Vec<_>>()
    );
    journal
        .append(samples_run.expect("the samples run"), lacking)
        .await
        .unwrap();
    drop(journal);
    let out = fixture();
    let _ = std::fs::remove_file(&out);
    let conn = rusqlite::Connection::open(&copy).unwrap();
    conn.execute("VACUUM INTO ?1", [out.to_str().unwrap()])
        .unwrap();
}

#[tokio::test]
async fn the_fixture_holds_every_stored_event_kind() {
    let state = tempfile::tempdir().unwrap();
    let copy = state.path().join("journal.sqlite");
    std::fs::copy(fixture(), &copy).unwrap();
    let journal = SqliteJournal::open(&copy, Arc::new(SystemClock)).unwrap();
    let mut held = BTreeSet::new();
    for run in journal.runs().await.unwrap() {
        // Every row reads back (a row that no longer decodes is an error here).
        for event in journal.read(run.id, 0).await.unwrap() {
            held.insert(event.kind.name());
        }
    }
    let missing: Vec<_> = stored_kinds().difference(&held).copied().collect();
    assert!(
        missing.is_empty(),
        "stored event kinds the fixture lacks (regenerate it, see this file's docs): {missing:?}"
    );
}

/// The daemon of today, started on the old journal, answers `runs` and each run's `status`
/// as pinned.
#[test]
fn a_daemon_reads_the_m9_journal_to_the_same_statuses() {
    let state = tempfile::tempdir().unwrap();
    std::fs::copy(fixture(), state.path().join("journal.sqlite")).unwrap();
    let _daemon = DaemonProcess::start(state.path());
    let flotilla = |args: &[&str]| {
        let out = Command::cargo_bin("flotilla")
            .unwrap()
            .arg("--state-dir")
            .arg(state.path())
            .env("NO_COLOR", "1")
            .env_remove("FLOTILLA_SOCKET")
            .args(args)
            .assert()
            .success();
        String::from_utf8(out.get_output().stdout.clone()).unwrap()
    };
    let runs = flotilla(&["runs", "--json"]);
    let listed: Vec<serde_json::Value> = serde_json::from_str(&runs).unwrap();
    assert_eq!(listed.len(), 2, "{runs}");
    let mut settings = insta::Settings::clone_current();
    settings.set_prepend_module_to_snapshot(true);
    settings.bind(|| {
        insta::assert_snapshot!("fixture_runs_json", runs);
        for (i, run) in listed.iter().enumerate() {
            let id = run["id"].as_str().unwrap();
            insta::assert_snapshot!(
                format!("fixture_status_json_{i}"),
                flotilla(&["status", id, "--json"])
            );
        }
    });
}
