//! The journal's append throughput (ADR-010): one append at a time (every caller waits for
//! its own commit, as a single run's TaskGraph does) against many appends in flight at once
//! (many runs, or one busy run's stream of events), with `synchronous` NORMAL and FULL.
//!
//! `cargo bench --bench journal` (criterion; throughput is in events per second).

// Test code: a failed unwrap is a failed test (the lint policy, ADR-027).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use flotilla::journal::{JournalSync, RunRecord, SqliteJournal};
use flotilla_actors::ports::{Journal, SystemClock};
use flotilla_actors::protocol::{EventKind, RunId, TaskId};

const APPENDS: u64 = 200;

fn journal(sync: JournalSync) -> (tempfile::TempDir, SqliteJournal, RunId) {
    let dir = tempfile::tempdir().unwrap();
    let journal = SqliteJournal::open_checked(
        &dir.path().join("journal.sqlite"),
        Arc::new(SystemClock),
        false,
        sync,
    )
    .unwrap();
    let run = RunId::generate();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(journal.create_run(RunRecord {
        id: run,
        request: "bench".into(),
        repo: "/tmp".into(),
        config: serde_json::json!({}),
        created_ms: 0,
        outcome: None,
    }))
    .unwrap();
    (dir, journal, run)
}

fn event(i: u64) -> Vec<EventKind> {
    vec![EventKind::TaskReady {
        task: TaskId::root(i as u32 + 1),
    }]
}

fn appends(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("journal_append");
    group.throughput(Throughput::Elements(APPENDS));
    group.sample_size(10);
    for sync in [JournalSync::Normal, JournalSync::Full] {
        let (_dir, journal, run) = journal(sync);
        group.bench_function(format!("{sync:?}/one_at_a_time"), |b| {
            b.iter(|| {
                rt.block_on(async {
                    for i in 0..APPENDS {
                        journal.append(run, event(i)).await.unwrap();
                    }
                })
            })
        });
        group.bench_function(format!("{sync:?}/all_in_flight"), |b| {
            b.iter(|| {
                rt.block_on(async {
                    let pending: Vec<_> = (0..APPENDS)
                        .map(|i| journal.append(run, event(i)))
                        .collect();
                    for append in pending {
                        append.await.unwrap();
                    }
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, appends);
criterion_main!(benches);
