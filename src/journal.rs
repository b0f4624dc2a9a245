//! The durable journal: SQLite (bundled) in WAL mode, one file under the state directory.
//!
//! Tables: `runs` (what was asked, where, with which config) and `events` (every event of
//! every run, `seq` assigned by SQLite's AUTOINCREMENT, so it is monotonic across runs and
//! restarts). A run's state is derived from its events; nothing else is stored.
//!
//! Writes go through one writer thread with a connection of its own (ADR-010). Appends that
//! arrive while a commit is in flight wait in its queue and go into the next transaction
//! together (group commit); each caller is answered once the transaction holding its events
//! has committed, so nothing acts on an event before it is durable. Reads use four other
//! connections (`READERS`) on tokio's blocking pool: in WAL mode they never wait for the writer.
//!
//! Appends are a savepoint each inside the group's transaction. `JournalSync` is
//! `daemon --journal-sync normal|full`. `submit_keys` makes submission idempotent: a key is
//! stored with its request's fingerprint, and a key reused for another request is refused.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use flotilla_actors::ports::{Clock, Journal, JournalError};
use flotilla_actors::protocol::{Event, EventKind, RunId, RunOutcome};
use futures::future::BoxFuture;
use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

/// Schema migrations, applied in order; `PRAGMA user_version` records how many ran.
const MIGRATIONS: &[&str] = &[
    // 1: runs and events.
    "CREATE TABLE runs (
         id TEXT PRIMARY KEY,
         request TEXT NOT NULL,
         repo TEXT NOT NULL,
         config TEXT NOT NULL,
         created_ms INTEGER NOT NULL
     );
     CREATE TABLE events (
         seq INTEGER PRIMARY KEY AUTOINCREMENT,
         run TEXT NOT NULL REFERENCES runs(id),
         at_ms INTEGER NOT NULL,
         kind TEXT NOT NULL,
         data TEXT NOT NULL
     );
     CREATE INDEX events_by_run ON events(run, seq);
     CREATE INDEX events_by_kind ON events(kind, run);",
    // 2: submissions' idempotency keys, so that a retried submit finds its run, and the
    // fingerprint of the request each key came with, so that a key reused for a different
    // request is refused rather than answered with the wrong run.
    "CREATE TABLE submit_keys (
         key TEXT PRIMARY KEY,
         run TEXT NOT NULL UNIQUE REFERENCES runs(id),
         fingerprint TEXT NOT NULL
     );",
    // 3: a finished run's status, folded once (ADR-040), so that `status` of a big finished
    // run does not replay its whole journal each time. `format` names what wrote it (another
    // flotilla folds again); `last_seq` is the last event folded (a journal that grew since
    // is folded again).
    "CREATE TABLE run_summaries (
         run TEXT PRIMARY KEY REFERENCES runs(id),
         format TEXT NOT NULL,
         last_seq INTEGER NOT NULL,
         summary TEXT NOT NULL
     );",
];

/// A run as registered, before any event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub id: RunId,
    pub request: String,
    pub repo: PathBuf,
    /// The run's configuration as JSON (see `config::RunConfig`).
    pub config: serde_json::Value,
    pub created_ms: u64,
    /// Derived from the journal: set once `run_finished` is recorded.
    pub outcome: Option<RunOutcome>,
}

/// A run as [`SqliteJournal::run_list`] lists it, and the branch its config names.
pub type RunWithBranch = (RunRecord, Option<String>);

#[derive(Clone)]
pub struct SqliteJournal {
    /// For reads only: a few connections, so that one long read (a big run's replay) does
    /// not hold up the others (tails, status).
    readers: Arc<Vec<Mutex<Connection>>>,
    /// The writer thread's queue: every write goes through it, in order.
    writer: mpsc::Sender<WriteJob>,
    clock: Arc<dyn Clock>,
    path: PathBuf,
    /// Configs read out of the runs table ([`SqliteJournal::configs_read`]).
    configs_read: Arc<std::sync::atomic::AtomicU64>,
}

/// How far a commit goes before it is answered (`flotilla daemon --journal-sync`, ADR-010).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum JournalSync {
    /// WAL with `synchronous=NORMAL`: a committed event survives a crash of the daemon (a
    /// SIGKILL, a panic); an OS crash or power loss can lose the last commits.
    #[default]
    Normal,
    /// `synchronous=FULL`: every commit is synced to disk before it is answered; it also
    /// survives an OS crash or power loss, at the cost of an fsync per commit.
    Full,
}

impl JournalSync {
    fn pragma(self) -> &'static str {
        match self {
            JournalSync::Normal => "NORMAL",
            JournalSync::Full => "FULL",
        }
    }
}

/// Read connections: tails, status and replays read side by side (WAL readers never wait
/// for the writer, nor for each other).
const READERS: usize = 4;

/// Each read connection's page cache, in KiB as SQLite takes it (negative). Replays and
/// folds read big runs once, in order: what they read is in the OS's page cache anyway, and
/// SQLite's default (2 MiB each) kept 8 MiB of the daemon's memory after the first replays
/// (ADR-040).
const READER_CACHE_KIB: i64 = -512;

/// The most appends one transaction takes: enough to amortize a commit over a burst, few
/// enough that the first caller of a group never waits long for the others.
const MAX_GROUP: usize = 512;

/// What the writer thread does.
enum WriteJob {
    /// Events of one `append`, already encoded; grouped with its neighbours.
    Append {
        run: RunId,
        at_ms: u64,
        events: Vec<(EventKind, String)>,
        reply: tokio::sync::oneshot::Sender<Result<Vec<Event>, JournalError>>,
    },
    /// Any other write, run alone in its own transaction (it answers by itself).
    Alone(Box<dyn FnOnce(&mut Connection) + Send>),
}

fn configure(conn: &Connection, sync: JournalSync) -> Result<(), JournalError> {
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(storage)?;
    conn.pragma_update(None, "synchronous", sync.pragma())
        .map_err(storage)?;
    conn.pragma_update(None, "foreign_keys", "ON")
        .map_err(storage)?;
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .map_err(storage)?;
    Ok(())
}

/// The writer thread: takes the first job waiting, then every job queued behind it (up to
/// [`MAX_GROUP`]), and commits the appends among them in one transaction. Ends when every
/// handle to the journal is gone.
fn write_loop(mut conn: Connection, jobs: mpsc::Receiver<WriteJob>) {
    while let Ok(first) = jobs.recv() {
        let mut appends = Vec::new();
        let mut next = Some(first);
        while let Some(job) = next.take() {
            match job {
                WriteJob::Append {
                    run,
                    at_ms,
                    events,
                    reply,
                } => appends.push((run, at_ms, events, reply)),
                WriteJob::Alone(write) => {
                    // What was queued before it commits first: order is kept.
                    commit_group(&mut conn, std::mem::take(&mut appends));
                    write(&mut conn);
                }
            }
            if appends.len() < MAX_GROUP {
                next = jobs.try_recv().ok();
            }
        }
        commit_group(&mut conn, appends);
    }
}

type Group = Vec<(
    RunId,
    u64,
    Vec<(EventKind, String)>,
    tokio::sync::oneshot::Sender<Result<Vec<Event>, JournalError>>,
)>;

/// One transaction for a group of appends. Each append is all-or-nothing on its own (a
/// savepoint): one that cannot be written (an unknown run) fails alone, and the others
/// commit. Each caller gets its own events once the transaction has committed, or the
/// error if it did not.
fn commit_group(conn: &mut Connection, group: Group) {
    if group.is_empty() {
        return;
    }
    let (appends, replies): (Vec<_>, Vec<_>) = group
        .into_iter()
        .map(|(run, at_ms, events, reply)| ((run, at_ms, events), reply))
        .unzip();
    let result: Result<Vec<Result<Vec<Event>, JournalError>>, JournalError> = (|| {
        let mut tx = conn.transaction().map_err(storage)?;
        let mut written = Vec::with_capacity(appends.len());
        for (run, at_ms, events) in appends {
            let mut savepoint = tx.savepoint().map_err(storage)?;
            let one = events
                .into_iter()
                .map(|(kind, data)| insert_encoded(&savepoint, run, at_ms, kind, &data))
                .collect::<Result<Vec<Event>, JournalError>>();
            match one {
                Ok(events) => {
                    savepoint.commit().map_err(storage)?;
                    written.push(Ok(events));
                }
                Err(e) => {
                    savepoint.rollback().map_err(storage)?;
                    drop(savepoint);
                    written.push(Err(e));
                }
            }
        }
        tx.commit().map_err(storage)?;
        COMMITS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(written)
    })();
    match result {
        Ok(written) => {
            for (reply, events) in replies.into_iter().zip(written) {
                // A caller that stopped waiting does not undo the commit.
                let _ = reply.send(events);
            }
        }
        Err(e) => {
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}

/// Transactions of appends committed by this process: what group commit saves is appends
/// minus commits (for tests and benchmarks).
static COMMITS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Transactions of appends committed so far by this process, every journal together.
pub fn append_commits() -> u64 {
    COMMITS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Why a journal that should exist could not be opened as it was.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(
        "the journal {path} is missing, but this state directory had one; flotilla will not silently start a new, empty journal"
    )]
    Missing { path: PathBuf },
    #[error(
        "the journal {path} is empty, but this state directory had one; flotilla will not silently start over"
    )]
    Empty { path: PathBuf },
    #[error(transparent)]
    Journal(#[from] JournalError),
}

fn storage(e: impl std::fmt::Display) -> JournalError {
    JournalError::Storage(e.to_string())
}

impl SqliteJournal {
    /// Opens (creating if needed) the journal and brings its schema up to date. Called once
    /// at daemon start-up, before any actor runs.
    pub fn open(path: &Path, clock: Arc<dyn Clock>) -> Result<Self, JournalError> {
        match Self::open_checked(path, clock, false, JournalSync::default()) {
            Ok(journal) => Ok(journal),
            Err(OpenError::Journal(e)) => Err(e),
            Err(other) => Err(storage(other)),
        }
    }

    /// Like [`open`](Self::open), but when `must_exist` (a journal was created here before)
    /// a missing file or one without a schema is an error instead of a fresh start.
    pub fn open_checked(
        path: &Path,
        clock: Arc<dyn Clock>,
        must_exist: bool,
        sync: JournalSync,
    ) -> Result<Self, OpenError> {
        if must_exist {
            let Ok(meta) = std::fs::metadata(path) else {
                return Err(OpenError::Missing { path: path.into() });
            };
            // A zero-length file with no write-ahead log beside it holds nothing; refuse it
            // before SQLite opens (and writes to) it, so that it is left as it was found.
            let wal = PathBuf::from(format!("{}-wal", path.display()));
            let wal_len = std::fs::metadata(&wal).map_or(0, |m| m.len());
            if meta.len() == 0 && wal_len == 0 {
                return Err(OpenError::Empty { path: path.into() });
            }
        }
        let mut conn = Connection::open(path).map_err(storage)?;
        configure(&conn, sync)?;
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(storage)?;
        if must_exist && version == 0 {
            return Err(OpenError::Empty { path: path.into() });
        }
        migrate(&mut conn)?;
        conn.pragma_update(None, "cache_size", READER_CACHE_KIB)
            .map_err(storage)?;
        let mut readers = vec![Mutex::new(conn)];
        for _ in 1..READERS {
            let reader = Connection::open(path).map_err(storage)?;
            configure(&reader, sync)?;
            reader
                .pragma_update(None, "cache_size", READER_CACHE_KIB)
                .map_err(storage)?;
            readers.push(Mutex::new(reader));
        }
        let writer_conn = Connection::open(path).map_err(storage)?;
        configure(&writer_conn, sync)?;
        let (writer, jobs) = mpsc::channel();
        std::thread::Builder::new()
            .name("journal-writer".into())
            .spawn(move || write_loop(writer_conn, jobs))
            .map_err(storage)?;
        Ok(SqliteJournal {
            readers: Arc::new(readers),
            writer,
            clock,
            path: path.to_path_buf(),
            configs_read: Arc::default(),
        })
    }

    /// Runs `write` on the writer thread, in its own transaction's place in the queue.
    fn write<T: Send + 'static>(
        &self,
        write: impl FnOnce(&mut Connection) -> Result<T, JournalError> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, JournalError>> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job = WriteJob::Alone(Box::new(move |conn| {
            let _ = reply.send(write(conn));
        }));
        let sent = self.writer.send(job);
        Box::pin(async move {
            sent.map_err(|_| storage("the journal's writer has stopped"))?;
            answer
                .await
                .map_err(|_| storage("the journal's writer stopped before answering"))?
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` with a free read connection (or, all busy, the next one) on the blocking
    /// pool.
    fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, JournalError> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, JournalError>> {
        let readers = self.readers.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let free = readers.iter().find_map(|reader| reader.try_lock().ok());
                let mut guard = match free {
                    Some(guard) => guard,
                    None => {
                        static NEXT: std::sync::atomic::AtomicUsize =
                            std::sync::atomic::AtomicUsize::new(0);
                        let i =
                            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % readers.len();
                        readers[i]
                            .lock()
                            .map_err(|_| storage("journal connection poisoned"))?
                    }
                };
                f(&mut guard)
            })
            .await
            .map_err(storage)?
        })
    }

    /// Registers a run and journals its `RunStarted` in one transaction.
    pub fn create_run(&self, record: RunRecord) -> BoxFuture<'static, Result<Event, JournalError>> {
        let id = record.id;
        let created = self.create_run_once(record, None, None);
        Box::pin(async move {
            match created.await? {
                SubmitOutcome::Created(event) => Ok(*event),
                // Without a key nothing can match an earlier run.
                SubmitOutcome::Existing(_) | SubmitOutcome::KeyReused(_) => {
                    Err(JournalError::Storage(format!(
                        "run {id} was not created: an earlier submission answered instead"
                    )))
                }
            }
        })
    }

    /// Every run, oldest first, with its outcome if it finished, and its stored config.
    /// Reads and parses every run's config: the daemon never calls it (a big run's config
    /// holds its scenario; see [`run_list`](Self::run_list)).
    pub fn runs(&self) -> BoxFuture<'static, Result<Vec<RunRecord>, JournalError>> {
        self.run_records(Listing::WithConfig)
    }

    /// Every run, oldest first, with its outcome, without its config (left `Null`): what
    /// listing, resolving ids and the daemon's start-up need, without reading and parsing
    /// every run's config (which made start-up and `runs` slow after a few large runs).
    pub fn run_list(&self) -> BoxFuture<'static, Result<Vec<RunRecord>, JournalError>> {
        self.run_records(Listing::WithoutConfig)
    }

    /// Every run as [`run_list`](Self::run_list) lists it, with the branch its config says
    /// it lands on (`merge.branch`), read by SQLite from the stored text: what `gc` needs,
    /// without parsing any config here. `None` when the config names none or is unreadable.
    pub fn run_list_with_branches(
        &self,
    ) -> BoxFuture<'static, Result<Vec<RunWithBranch>, JournalError>> {
        self.run_rows(Listing::WithBranch)
    }

    /// One run, with its config.
    pub fn run(&self, id: RunId) -> BoxFuture<'static, Result<Option<RunRecord>, JournalError>> {
        let records = self.run_records(Listing::One(id));
        Box::pin(async move { Ok(records.await?.into_iter().next()) })
    }

    /// Configs this journal (every clone of it) has read out of the runs table: for tests
    /// that check that the daemon's start-up reads only the configs of the runs it resumes.
    pub fn configs_read(&self) -> u64 {
        self.configs_read.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn run_records(
        &self,
        listing: Listing,
    ) -> BoxFuture<'static, Result<Vec<RunRecord>, JournalError>> {
        let rows = self.run_rows(listing);
        Box::pin(async move { Ok(rows.await?.into_iter().map(|(r, _)| r).collect()) })
    }

    fn run_rows(
        &self,
        listing: Listing,
    ) -> BoxFuture<'static, Result<Vec<RunWithBranch>, JournalError>> {
        let configs_read = self.configs_read.clone();
        self.blocking(move |conn| {
            let config = match listing {
                Listing::WithoutConfig | Listing::WithBranch => "'null'",
                Listing::WithConfig | Listing::One(_) => "r.config",
            };
            // SQLite's JSON functions read the text where it is; an invalid config (or a
            // branch that is no text) gives NULL rather than failing the whole listing.
            let branch = match listing {
                Listing::WithBranch => {
                    "CASE WHEN json_valid(r.config) AND json_type(r.config, '$.merge.branch') = 'text'
                          THEN json_extract(r.config, '$.merge.branch') END"
                }
                _ => "NULL",
            };
            let only = match listing {
                Listing::One(_) => "WHERE r.id = ?1",
                _ => "",
            };
            let sql = format!(
                "SELECT r.id, r.request, r.repo, {config}, r.created_ms,
                        (SELECT data FROM events e WHERE e.run = r.id AND e.kind = 'run_finished' LIMIT 1),
                        {branch}
                 FROM runs r {only} ORDER BY r.created_ms, r.id"
            );
            let mut stmt = conn.prepare(&sql).map_err(storage)?;
            let id_param = match listing {
                Listing::One(id) => vec![id.to_string()],
                _ => Vec::new(),
            };
            let rows = stmt
                .query_map(rusqlite::params_from_iter(id_param.iter()), |row| {
                    Ok((
                        row.get::<_, String>(0)?,
                        row.get::<_, String>(1)?,
                        row.get::<_, String>(2)?,
                        row.get::<_, String>(3)?,
                        row.get::<_, i64>(4)?,
                        row.get::<_, Option<String>>(5)?,
                        row.get::<_, Option<String>>(6)?,
                    ))
                })
                .map_err(storage)?;
            let mut runs = Vec::new();
            for row in rows {
                // One unreadable row must not hide every other run (nor stop the daemon
                // from starting): it is skipped, or its run is listed with what is readable.
                let (id, request, repo, config, created_ms, finished, branch) = match row {
                    Ok(row) => row,
                    Err(e) => {
                        tracing::error!(error = %e, "skipping an unreadable row of the runs table");
                        continue;
                    }
                };
                let Ok(id) = id.parse::<RunId>() else {
                    tracing::error!(id = %id, "skipping a run whose id is unreadable");
                    continue;
                };
                let outcome = match finished {
                    Some(data) => match serde_json::from_str::<EventKind>(&data) {
                        Ok(EventKind::RunFinished { outcome, .. }) => Some(outcome),
                        _ => None,
                    },
                    None => None,
                };
                if matches!(listing, Listing::WithConfig | Listing::One(_)) {
                    configs_read.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                let record = RunRecord {
                    id,
                    request,
                    repo: PathBuf::from(repo),
                    // Null fails to load as a `RunConfig`, which marks the run damaged.
                    config: serde_json::from_str(&config).unwrap_or(serde_json::Value::Null),
                    created_ms: created_ms as u64,
                    outcome,
                };
                runs.push((record, branch));
            }
            Ok(runs)
        })
    }

    /// At most `limit` of a run's events after `after`, in order: a replay reads a big run
    /// page by page (ADR-040), so that it holds one page at a time.
    pub fn read_page(
        &self,
        run: RunId,
        after: u64,
        limit: usize,
    ) -> BoxFuture<'static, Result<Vec<Event>, JournalError>> {
        self.blocking(move |conn| read_events(conn, run, after, Some(limit)))
    }

    /// A finished run's stored summary, if one was stored in this `format` and folded the
    /// run's journal up to its last event (`store_summary`).
    pub fn summary(
        &self,
        run: RunId,
        format: &'static str,
    ) -> BoxFuture<'static, Result<Option<String>, JournalError>> {
        self.blocking(move |conn| {
            conn.prepare_cached(
                "SELECT s.summary FROM run_summaries s
                 WHERE s.run = ?1 AND s.format = ?2
                   AND s.last_seq = (SELECT MAX(seq) FROM events WHERE run = ?1)",
            )
            .and_then(|mut stmt| {
                stmt.query_row(params![run.to_string(), format], |r| r.get(0))
                    .optional()
            })
            .map_err(storage)
        })
    }

    /// Stores a finished run's summary, folded from its events up to `last_seq`, in
    /// `format`; it replaces any earlier one.
    pub fn store_summary(
        &self,
        run: RunId,
        format: &'static str,
        last_seq: u64,
        summary: String,
    ) -> BoxFuture<'static, Result<(), JournalError>> {
        self.write(move |conn| {
            conn.execute(
                "INSERT OR REPLACE INTO run_summaries (run, format, last_seq, summary)
                 VALUES (?1, ?2, ?3, ?4)",
                params![run.to_string(), format, last_seq as i64, summary],
            )
            .map(drop)
            .map_err(storage)
        })
    }

    /// Folds a run's events after `after` page by page (`page` events at a time) into
    /// `state`, on one read connection off the runtime: what a fold of a big run holds is
    /// its state and one page, never the whole journal.
    pub fn fold_pages<T: Send + 'static>(
        &self,
        run: RunId,
        after: u64,
        page: usize,
        mut state: T,
        mut fold: impl FnMut(&mut T, &[Event]) + Send + 'static,
    ) -> BoxFuture<'static, Result<T, JournalError>> {
        let page = page.max(1);
        self.blocking(move |conn| {
            let mut last = after;
            loop {
                let events = read_events(conn, run, last, Some(page))?;
                let Some(end) = events.last().map(|e| e.seq) else {
                    return Ok(state);
                };
                fold(&mut state, &events);
                if events.len() < page {
                    return Ok(state);
                }
                last = end;
            }
        })
    }

    /// The highest `seq` of a run, 0 if none.
    pub fn last_seq(&self, run: RunId) -> BoxFuture<'static, Result<u64, JournalError>> {
        self.blocking(move |conn| {
            conn.query_row(
                "SELECT MAX(seq) FROM events WHERE run = ?1",
                params![run.to_string()],
                |r| r.get::<_, Option<i64>>(0),
            )
            .optional()
            .map(|v| v.flatten().unwrap_or(0) as u64)
            .map_err(storage)
        })
    }
}

fn migrate(conn: &mut Connection) -> Result<(), JournalError> {
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(storage)?;
    let known = MIGRATIONS.len() as i64;
    if version > known {
        return Err(JournalError::Storage(format!(
            "the journal has schema version {version}, newer than this flotilla knows ({known}); upgrade flotilla"
        )));
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        let tx = conn.transaction().map_err(storage)?;
        tx.execute_batch(sql).map_err(storage)?;
        tx.pragma_update(None, "user_version", i as i64 + 1)
            .map_err(storage)?;
        tx.commit().map_err(storage)?;
    }
    Ok(())
}

fn insert_event(
    conn: &Connection,
    run: RunId,
    at_ms: u64,
    kind: EventKind,
) -> Result<Event, JournalError> {
    let data = serde_json::to_string(&kind).map_err(storage)?;
    insert_encoded(conn, run, at_ms, kind, &data)
}

fn insert_encoded(
    conn: &Connection,
    run: RunId,
    at_ms: u64,
    kind: EventKind,
    data: &str,
) -> Result<Event, JournalError> {
    conn.prepare_cached("INSERT INTO events (run, at_ms, kind, data) VALUES (?1, ?2, ?3, ?4)")
        .and_then(|mut insert| {
            insert.execute(params![run.to_string(), at_ms as i64, kind.name(), data])
        })
        .map_err(storage)?;
    Ok(Event {
        seq: conn.last_insert_rowid() as u64,
        run,
        at_ms,
        kind,
    })
}

impl Journal for SqliteJournal {
    fn append(
        &self,
        run: RunId,
        events: Vec<EventKind>,
    ) -> BoxFuture<'static, Result<Vec<Event>, JournalError>> {
        let at_ms = self.clock.now_ms();
        // Encoded here, by the caller: the writer thread only writes.
        let encoded: Result<Vec<(EventKind, String)>, JournalError> = events
            .into_iter()
            .map(|kind| {
                let data = serde_json::to_string(&kind).map_err(storage)?;
                Ok((kind, data))
            })
            .collect();
        let (reply, answer) = tokio::sync::oneshot::channel();
        let sent = encoded.map(|events| {
            self.writer.send(WriteJob::Append {
                run,
                at_ms,
                events,
                reply,
            })
        });
        Box::pin(async move {
            sent?.map_err(|_| storage("the journal's writer has stopped"))?;
            answer
                .await
                .map_err(|_| storage("the journal's writer stopped before answering"))?
        })
    }

    fn read(&self, run: RunId, after: u64) -> BoxFuture<'static, Result<Vec<Event>, JournalError>> {
        self.blocking(move |conn| read_events(conn, run, after, None))
    }
}

/// A run's events after `after`, in order: all of them, or the first `limit`.
fn read_events(
    conn: &Connection,
    run: RunId,
    after: u64,
    limit: Option<usize>,
) -> Result<Vec<Event>, JournalError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT seq, at_ms, data FROM events WHERE run = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
        )
        .map_err(storage)?;
    // A negative LIMIT is none.
    let limit = limit.map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX));
    let rows = stmt
        .query_map(params![run.to_string(), after as i64, limit], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, String>(2)?,
            ))
        })
        .map_err(storage)?;
    let mut out = Vec::new();
    for row in rows {
        let (seq, at_ms, data) = row.map_err(storage)?;
        let kind = serde_json::from_str(&data).map_err(|e| JournalError::Corrupt {
            seq: seq as u64,
            detail: e.to_string(),
        })?;
        out.push(Event {
            seq: seq as u64,
            run,
            at_ms: at_ms as u64,
            kind,
        });
    }
    Ok(out)
}

/// Which runs a listing reads, and whether with their config.
#[derive(Debug, Clone, Copy)]
enum Listing {
    WithConfig,
    WithoutConfig,
    /// Without the config, with the branch it names.
    WithBranch,
    One(RunId),
}

/// What [`SqliteJournal::create_run_once`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum SubmitOutcome {
    /// A new run, and its `RunStarted`.
    Created(Box<Event>),
    /// The key was already used, for the same request: the run created for it then.
    Existing(RunId),
    /// The key was already used for a different request (the run created for it then).
    KeyReused(RunId),
}

/// A submission's idempotency key and the fingerprint of the request it came with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmitKey {
    pub key: String,
    pub fingerprint: String,
}

impl SqliteJournal {
    /// [`SqliteJournal::create_run`], at most once per idempotency `key`: the run, its
    /// `RunStarted` and the key are written in one transaction, and a key seen before returns
    /// the run it created instead, if it came with the same request fingerprint
    /// ([`SubmitOutcome::KeyReused`] otherwise). Without a key, always a new run.
    /// `sandbox` says which sandbox the run's commands are in, for its `RunStarted`.
    pub fn create_run_once(
        &self,
        record: RunRecord,
        key: Option<SubmitKey>,
        sandbox: Option<String>,
    ) -> BoxFuture<'static, Result<SubmitOutcome, JournalError>> {
        let at_ms = self.clock.now_ms();
        self.write(move |conn| {
            let tx = conn.transaction().map_err(storage)?;
            if let Some(key) = &key {
                let existing: Option<(String, String)> = tx
                    .query_row(
                        "SELECT run, fingerprint FROM submit_keys WHERE key = ?1",
                        params![key.key],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .optional()
                    .map_err(storage)?;
                if let Some((run, fingerprint)) = existing {
                    let run = run.parse().map_err(storage)?;
                    return Ok(if fingerprint == key.fingerprint {
                        SubmitOutcome::Existing(run)
                    } else {
                        SubmitOutcome::KeyReused(run)
                    });
                }
            }
            tx.execute(
                "INSERT INTO runs (id, request, repo, config, created_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    record.id.to_string(),
                    record.request,
                    record.repo.to_string_lossy(),
                    record.config.to_string(),
                    record.created_ms as i64
                ],
            )
            .map_err(storage)?;
            if let Some(key) = &key {
                tx.execute(
                    "INSERT INTO submit_keys (key, run, fingerprint) VALUES (?1, ?2, ?3)",
                    params![key.key, record.id.to_string(), key.fingerprint],
                )
                .map_err(storage)?;
            }
            let kind = EventKind::RunStarted {
                request: record.request.clone(),
                sandbox,
            };
            let event = insert_event(&tx, record.id, at_ms, kind)?;
            tx.commit().map_err(storage)?;
            Ok(SubmitOutcome::Created(Box::new(event)))
        })
    }
}

#[cfg(test)]
mod tests {
    use flotilla_actors::ports::SystemClock;
    use flotilla_actors::protocol::TaskId;

    use super::*;

    fn record(id: RunId) -> RunRecord {
        RunRecord {
            id,
            request: "build it".into(),
            repo: "/tmp/repo".into(),
            config: serde_json::json!({}),
            created_ms: 1,
            outcome: None,
        }
    }

    #[tokio::test]
    async fn appends_that_queue_during_a_commit_share_the_next_one_and_each_gets_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let j = SqliteJournal::open(&dir.path().join("j.sqlite"), Arc::new(SystemClock)).unwrap();
        let runs: Vec<RunId> = (0..4).map(|_| RunId::generate()).collect();
        for run in &runs {
            j.create_run(record(*run)).await.unwrap();
        }
        let before = append_commits();
        // 400 appends of two events each, all queued before any is awaited.
        let pending: Vec<_> = (0..400u32)
            .map(|i| {
                let run = runs[i as usize % runs.len()];
                let events = vec![
                    EventKind::TaskReady {
                        task: TaskId::root(i + 1),
                    },
                    EventKind::TaskReady {
                        task: TaskId::root(i + 10_000),
                    },
                ];
                (run, i, j.append(run, events))
            })
            .collect();
        let mut seqs = Vec::new();
        for (run, i, append) in pending {
            let events = append.await.unwrap();
            assert_eq!(events.len(), 2);
            assert!(events.iter().all(|e| e.run == run));
            assert_eq!(
                events[1].seq,
                events[0].seq + 1,
                "an append's events stay together"
            );
            assert_eq!(
                events[0].kind,
                EventKind::TaskReady {
                    task: TaskId::root(i + 1)
                }
            );
            seqs.extend(events.iter().map(|e| e.seq));
        }
        let mut sorted = seqs.clone();
        sorted.sort();
        assert_eq!(sorted, seqs, "answered in the order they were asked");
        sorted.dedup();
        assert_eq!(sorted.len(), 800);
        let commits = append_commits() - before;
        assert!(
            commits < 400,
            "{commits} commits for 400 appends: none was grouped"
        );
        // Every one of them is durable and readable.
        let total: usize = {
            let mut n = 0;
            for run in &runs {
                n += j.read(*run, 0).await.unwrap().len();
            }
            n
        };
        assert_eq!(total, 4 + 800);
    }

    #[tokio::test]
    async fn an_append_that_cannot_be_written_fails_alone_in_its_group() {
        let dir = tempfile::tempdir().unwrap();
        let j = SqliteJournal::open(&dir.path().join("j.sqlite"), Arc::new(SystemClock)).unwrap();
        let known = RunId::generate();
        j.create_run(record(known)).await.unwrap();
        let unknown = RunId::generate();
        let event = || vec![EventKind::PlanningFinished];
        let (a, b, c) = (
            j.append(known, event()),
            j.append(unknown, event()),
            j.append(known, event()),
        );
        assert!(a.await.is_ok());
        assert!(
            matches!(b.await, Err(JournalError::Storage(_))),
            "no such run"
        );
        assert!(c.await.is_ok());
        assert_eq!(j.read(known, 0).await.unwrap().len(), 3);
        assert!(j.read(unknown, 0).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn the_run_list_leaves_configs_out_and_one_run_is_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let j = SqliteJournal::open(&dir.path().join("j.sqlite"), Arc::new(SystemClock)).unwrap();
        let (a, b) = (RunId::generate(), RunId::generate());
        for id in [a, b] {
            let mut r = record(id);
            r.config = serde_json::json!({ "limits": { "max_workers": 7 } });
            j.create_run(r).await.unwrap();
        }
        j.append(
            b,
            vec![EventKind::RunFinished {
                outcome: RunOutcome::Completed,
                reason: None,
            }],
        )
        .await
        .unwrap();
        let listed = j.run_list().await.unwrap();
        assert_eq!(listed.iter().map(|r| r.id).collect::<Vec<_>>(), [a, b]);
        assert!(listed.iter().all(|r| r.config.is_null()));
        assert_eq!(listed[1].outcome, Some(RunOutcome::Completed));
        let one = j.run(b).await.unwrap().unwrap();
        assert_eq!(one.config["limits"]["max_workers"], 7);
        assert_eq!(one.outcome, Some(RunOutcome::Completed));
        assert!(j.run(RunId::generate()).await.unwrap().is_none());
        assert_eq!(
            j.runs().await.unwrap()[0].config["limits"]["max_workers"],
            7
        );
    }

    #[tokio::test]
    async fn events_survive_reopening_with_monotonic_seqs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.sqlite");
        let run = RunId::generate();
        {
            let j = SqliteJournal::open(&path, Arc::new(SystemClock)).unwrap();
            j.create_run(record(run)).await.unwrap();
            let appended = j
                .append(
                    run,
                    vec![
                        EventKind::TaskReady {
                            task: TaskId::root(1),
                        },
                        EventKind::PlanningFinished,
                    ],
                )
                .await
                .unwrap();
            assert_eq!(appended.iter().map(|e| e.seq).collect::<Vec<_>>(), [2, 3]);
        }
        let j = SqliteJournal::open(&path, Arc::new(SystemClock)).unwrap();
        let events = j.read(run, 1).await.unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(
            events[0].kind,
            EventKind::TaskReady {
                task: TaskId::root(1)
            }
        );
        let more = j
            .append(
                run,
                vec![EventKind::RunFinished {
                    outcome: RunOutcome::Completed,
                    reason: None,
                }],
            )
            .await
            .unwrap();
        assert_eq!(more[0].seq, 4);
        let runs = j.runs().await.unwrap();
        assert_eq!(runs[0].outcome, Some(RunOutcome::Completed));
        assert_eq!(j.last_seq(run).await.unwrap(), 4);
    }

    /// A replay's pages (and a fold's) give exactly the run's events, in order, whatever
    /// the page size: none lost or repeated at a page's edge, none of another run's.
    #[tokio::test]
    async fn pages_hold_every_event_once_in_order_across_their_boundaries() {
        let dir = tempfile::tempdir().unwrap();
        let j = SqliteJournal::open(&dir.path().join("j.sqlite"), Arc::new(SystemClock)).unwrap();
        let (run, other) = (RunId::generate(), RunId::generate());
        j.create_run(record(run)).await.unwrap();
        j.create_run(record(other)).await.unwrap();
        for i in 1..=9u32 {
            let ready = |n| EventKind::TaskReady {
                task: TaskId::root(n),
            };
            j.append(run, vec![ready(i)]).await.unwrap();
            // The other run's events interleave: the run's seqs have gaps.
            j.append(other, vec![ready(i), ready(i + 100)])
                .await
                .unwrap();
        }
        let whole = j.read(run, 0).await.unwrap();
        assert_eq!(whole.len(), 10);
        for page in 1..=12 {
            let mut paged = Vec::new();
            let mut last = 0;
            loop {
                let events = j.read_page(run, last, page).await.unwrap();
                assert!(events.len() <= page);
                let Some(end) = events.last() else { break };
                last = end.seq;
                paged.extend(events);
            }
            assert_eq!(paged, whole, "pages of {page}");
            let folded = j
                .fold_pages(run, 0, page, Vec::new(), |all, events| {
                    all.extend_from_slice(events)
                })
                .await
                .unwrap();
            assert_eq!(folded, whole, "a fold in pages of {page}");
            let after = whole[3].seq;
            let rest = j
                .fold_pages(run, after, page, Vec::new(), |all, events| {
                    all.extend_from_slice(events)
                })
                .await
                .unwrap();
            assert_eq!(rest, whole[4..], "a fold after #{after} in pages of {page}");
        }
    }

    /// `gc`'s listing takes each run's branch from its stored config without reading the
    /// config here; a config that does not read (or names no text) gives none, and the
    /// others are listed all the same. Only `run` reads a config.
    #[tokio::test]
    async fn the_branch_listing_reads_no_config_and_survives_an_unreadable_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.sqlite");
        let j = SqliteJournal::open(&path, Arc::new(SystemClock)).unwrap();
        let configs = [
            serde_json::json!({ "merge": { "branch": "trunk" } }),
            serde_json::json!({ "merge": { "branch": 7 } }),
            serde_json::json!({}),
            serde_json::json!({}),
        ];
        let mut ids = Vec::new();
        for (i, config) in configs.into_iter().enumerate() {
            let mut r = record(RunId::generate());
            r.config = config;
            r.created_ms = i as u64;
            ids.push(r.id);
            j.create_run(r).await.unwrap();
        }
        Connection::open(&path)
            .unwrap()
            .execute(
                "UPDATE runs SET config = '{\"merge\": not json' WHERE id = ?1",
                params![ids[3].to_string()],
            )
            .unwrap();
        let listed = j.run_list_with_branches().await.unwrap();
        let branches: Vec<_> = listed.iter().map(|(r, b)| (r.id, b.clone())).collect();
        assert_eq!(
            branches,
            [
                (ids[0], Some("trunk".to_string())),
                (ids[1], None),
                (ids[2], None),
                (ids[3], None),
            ]
        );
        assert!(listed.iter().all(|(r, _)| r.config.is_null()));
        j.run_list().await.unwrap();
        assert_eq!(j.configs_read(), 0, "listing reads no config");
        assert!(j.run(ids[3]).await.unwrap().unwrap().config.is_null());
        assert_eq!(j.configs_read(), 1);
    }

    /// A stored summary answers only in the format it was stored in, and only while the
    /// run's journal ends where the summary's fold ended.
    #[tokio::test]
    async fn a_stored_summary_holds_only_for_its_format_and_the_journal_it_folded() {
        let dir = tempfile::tempdir().unwrap();
        let j = SqliteJournal::open(&dir.path().join("j.sqlite"), Arc::new(SystemClock)).unwrap();
        let run = RunId::generate();
        j.create_run(record(run)).await.unwrap();
        assert_eq!(j.summary(run, "f1").await.unwrap(), None);
        let last = j.last_seq(run).await.unwrap();
        j.store_summary(run, "f1", last, "folded".into())
            .await
            .unwrap();
        assert_eq!(
            j.summary(run, "f1").await.unwrap().as_deref(),
            Some("folded")
        );
        assert_eq!(j.summary(run, "f2").await.unwrap(), None, "another format");
        j.append(run, vec![EventKind::PlanningFinished])
            .await
            .unwrap();
        assert_eq!(
            j.summary(run, "f1").await.unwrap(),
            None,
            "the journal grew"
        );
        let last = j.last_seq(run).await.unwrap();
        j.store_summary(run, "f1", last, "again".into())
            .await
            .unwrap();
        assert_eq!(
            j.summary(run, "f1").await.unwrap().as_deref(),
            Some("again")
        );
    }

    #[test]
    fn a_journal_from_a_newer_flotilla_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.sqlite");
        let conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "user_version", 99).unwrap();
        drop(conn);
        let err = SqliteJournal::open(&path, Arc::new(SystemClock))
            .err()
            .unwrap();
        assert!(
            err.to_string().contains("newer than this flotilla"),
            "{err}"
        );
    }
}
