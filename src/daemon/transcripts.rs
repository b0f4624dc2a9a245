//! Attempts' transcripts (ADR-036): each attempt's conversation as JSON lines in
//! `<state-dir>/transcripts/<run>/<task>-a<n>.jsonl`, append-only, bounded.
//!
//! Agents write through a [`TranscriptSink`] (the Worker opens one per attempt through
//! [`TranscriptStore::transcripts`]); the sink only queues (a channel send: it never blocks
//! an actor) and the store's writer thread does the file work. An entry is cut to
//! [`ENTRY_CAP_BYTES`]; a file stops growing at the store's cap with one `truncated` entry
//! (the sink stops queueing at the same cap, so a spewing agent cannot fill memory either);
//! the `end` entry, written when the Worker stops, always goes in. A write error is logged
//! once per file and never reaches the attempt. After each batch of writes the writer bumps
//! a watch channel: `flotilla log --follow` waits on it (the API's long poll) rather than
//! polling the file.
//!
//! The store also knows which attempts still have a sink whose last entry may be on its
//! way ([`TranscriptStore::is_open`]): a run's outcome is journaled before its Workers are
//! told to stop, so "the run is over" alone does not say that an attempt's `end` is in
//! its file yet.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use flotilla_actors::ports::{
    Clock, SystemClock, TranscriptKind, TranscriptSink, TranscriptWriter, Transcripts,
};
use flotilla_actors::protocol::{RunId, TaskId};
use tokio::sync::watch;
use tracing::warn;

use crate::api::transcript::TranscriptLine;

/// The most of one attempt's transcript kept, by default.
pub const DEFAULT_CAP_BYTES: u64 = 4 * 1024 * 1024;
/// The most of one entry kept (a huge tool output keeps its beginning).
pub const ENTRY_CAP_BYTES: usize = 64 * 1024;

enum Write_ {
    Line {
        path: PathBuf,
        line: String,
    },
    /// The sink passed the cap: the file says so (once).
    Capped {
        path: PathBuf,
    },
    End {
        path: PathBuf,
    },
    /// A sink was dropped: after what it queued, its attempt is no longer open.
    Closed {
        path: PathBuf,
    },
}

/// How many live sinks each attempt's file has (one, but a resumed attempt can open its
/// file again while the old sink's last entries are still queued).
type OpenSinks = Arc<Mutex<HashMap<PathBuf, usize>>>;

/// Where transcripts live, and the thread that writes them. Cheap to clone; the writer
/// thread ends when the last clone (and every sink) is gone.
#[derive(Clone)]
pub struct TranscriptStore {
    root: PathBuf,
    cap: u64,
    queue: mpsc::Sender<Write_>,
    written: watch::Receiver<u64>,
    sinks: OpenSinks,
}

impl TranscriptStore {
    /// Starts the writer thread.
    pub fn start(root: PathBuf, cap: u64) -> std::io::Result<Self> {
        let (queue, requests) = mpsc::channel();
        let (bump, written) = watch::channel(0u64);
        let sinks = OpenSinks::default();
        let writer = FileWriter {
            cap,
            open: HashMap::new(),
            bump,
            sinks: sinks.clone(),
        };
        std::thread::Builder::new()
            .name("flotilla-transcripts".into())
            .spawn(move || writer.serve(requests))?;
        Ok(TranscriptStore {
            root,
            cap,
            queue,
            written,
            sinks,
        })
    }

    /// Whether the attempt whose transcript is at `path` has a sink still open, or one
    /// whose entries are not all written yet: its file may still grow. When this says no,
    /// everything its sinks queued (their `end` included) is in the file.
    pub fn is_open(&self, path: &Path) -> bool {
        lock(&self.sinks).contains_key(path)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Changes after every batch of writes.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.written.clone()
    }

    pub fn path(&self, run: RunId, task: &TaskId, attempt: u32) -> PathBuf {
        self.root
            .join(run.to_string())
            .join(format!("{task}-a{attempt}.jsonl"))
    }

    /// Opens attempts' transcripts for a run's Workers.
    pub fn transcripts(&self) -> Transcripts {
        let store = self.clone();
        Transcripts::new(move |run, task, attempt| {
            let path = store.path(run, task, attempt);
            *lock(&store.sinks).entry(path.clone()).or_default() += 1;
            TranscriptSink::new(Arc::new(AttemptWriter {
                path,
                cap: store.cap,
                queue: store.queue.clone(),
                queued: AtomicU64::new(0),
                capped: AtomicBool::new(false),
            }))
        })
    }
}

/// One attempt's sink: formats the entry and queues it.
struct AttemptWriter {
    path: PathBuf,
    cap: u64,
    queue: mpsc::Sender<Write_>,
    queued: AtomicU64,
    capped: AtomicBool,
}

impl TranscriptWriter for AttemptWriter {
    fn record(&self, kind: TranscriptKind, text: &str) {
        if self.capped.load(Ordering::Relaxed) {
            return;
        }
        let line = entry_line(kind, &cut(text, ENTRY_CAP_BYTES));
        let before = self.queued.fetch_add(line.len() as u64, Ordering::Relaxed);
        if before.saturating_add(line.len() as u64) > self.cap {
            if !self.capped.swap(true, Ordering::Relaxed) {
                let _ = self.queue.send(Write_::Capped {
                    path: self.path.clone(),
                });
            }
            return;
        }
        // The writer is gone only when the daemon is stopping: nothing to do.
        let _ = self.queue.send(Write_::Line {
            path: self.path.clone(),
            line,
        });
    }

    fn end(&self) {
        let _ = self.queue.send(Write_::End {
            path: self.path.clone(),
        });
    }
}

impl Drop for AttemptWriter {
    fn drop(&mut self) {
        // Through the queue, so that it counts only once what this sink queued is written.
        let _ = self.queue.send(Write_::Closed {
            path: std::mem::take(&mut self.path),
        });
    }
}

/// The map of open sinks, whatever a panic elsewhere left it as (counts only).
fn lock(sinks: &OpenSinks) -> std::sync::MutexGuard<'_, HashMap<PathBuf, usize>> {
    sinks
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn entry_line(kind: TranscriptKind, text: &str) -> String {
    let entry = TranscriptLine {
        at_ms: SystemClock.now_ms(),
        kind,
        text: text.to_string(),
    };
    let mut line = serde_json::to_string(&entry).unwrap_or_default();
    line.push('\n');
    line
}

/// `text`, cut at a character boundary to about `max` bytes, saying how much was cut.
fn cut(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return text.into();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}\n… [{} more bytes cut from this entry]",
        &text[..end],
        text.len() - end
    )
    .into()
}

struct OpenFile {
    file: Option<File>,
    size: u64,
    capped: bool,
    /// A write failed: logged once, and the file is left alone since.
    failed: bool,
}

struct FileWriter {
    cap: u64,
    open: HashMap<PathBuf, OpenFile>,
    bump: watch::Sender<u64>,
    sinks: OpenSinks,
}

impl FileWriter {
    fn serve(mut self, requests: mpsc::Receiver<Write_>) {
        while let Ok(first) = requests.recv() {
            self.handle(first);
            // Whatever queued meanwhile goes in the same batch: one wake-up for followers.
            while let Ok(next) = requests.try_recv() {
                self.handle(next);
            }
            self.bump.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    fn handle(&mut self, request: Write_) {
        match request {
            Write_::Line { path, line } => {
                let cap = self.cap;
                let file = self.file(&path);
                if file.capped {
                    return;
                }
                if file.size.saturating_add(line.len() as u64) > cap {
                    file.capped = true;
                    let marker = marker(TranscriptKind::Truncated, cap);
                    write(&path, file, &marker);
                } else {
                    write(&path, file, &line);
                }
            }
            Write_::Capped { path } => {
                let cap = self.cap;
                let file = self.file(&path);
                if !file.capped {
                    file.capped = true;
                    write(&path, file, &marker(TranscriptKind::Truncated, cap));
                }
            }
            Write_::End { path } => {
                let mut file = self.open.remove(&path).unwrap_or_else(|| open(&path));
                write(&path, &mut file, &marker(TranscriptKind::End, self.cap));
            }
            Write_::Closed { path } => {
                let mut sinks = lock(&self.sinks);
                if let Some(count) = sinks.get_mut(&path) {
                    *count -= 1;
                    if *count == 0 {
                        sinks.remove(&path);
                        // Nothing more comes for it (an `end` already closed it).
                        self.open.remove(&path);
                    }
                }
            }
        }
    }

    fn file(&mut self, path: &Path) -> &mut OpenFile {
        self.open
            .entry(path.to_path_buf())
            .or_insert_with(|| open(path))
    }
}

fn marker(kind: TranscriptKind, cap: u64) -> String {
    let text = match kind {
        TranscriptKind::Truncated => {
            format!("the transcript reached its cap of {cap} bytes: later entries were dropped")
        }
        _ => "the attempt ended".to_string(),
    };
    entry_line(kind, &text)
}

fn open(path: &Path) -> OpenFile {
    let opened = (|| {
        if let Some(dir) = path.parent() {
            if let Some(root) = dir.parent() {
                crate::paths::ensure_private_dir(root)?;
            }
            std::fs::create_dir_all(dir)?;
        }
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)?;
        let size = file.metadata()?.len();
        Ok::<_, std::io::Error>((file, size))
    })();
    match opened {
        Ok((file, size)) => OpenFile {
            file: Some(file),
            size,
            capped: false,
            failed: false,
        },
        Err(e) => {
            warn!(path = %path.display(), error = %e, "cannot open a transcript: this attempt's is not kept");
            OpenFile {
                file: None,
                size: 0,
                capped: false,
                failed: true,
            }
        }
    }
}

fn write(path: &Path, file: &mut OpenFile, line: &str) {
    if file.failed {
        return;
    }
    let Some(handle) = file.file.as_mut() else {
        return;
    };
    match handle.write_all(line.as_bytes()) {
        Ok(()) => file.size = file.size.saturating_add(line.len() as u64),
        Err(e) => {
            file.failed = true;
            warn!(path = %path.display(), error = %e, "cannot write a transcript: the rest of this attempt's is not kept");
        }
    }
}

/// What a read of a transcript found.
#[derive(Debug, Default)]
pub struct ReadBack {
    pub entries: Vec<TranscriptLine>,
    /// The offset after the last whole line read.
    pub next: u64,
    pub ended: bool,
}

/// The whole lines of `path` from byte `from` on (a line being written is left for the
/// next read). A line that does not parse becomes a `step` entry saying so.
pub fn read_from(path: &Path, from: u64) -> std::io::Result<ReadBack> {
    let mut file = File::open(path)?;
    let size = file.metadata()?.len();
    let from = from.min(size);
    file.seek(SeekFrom::Start(from))?;
    let mut reader = BufReader::new(file.take(size - from));
    let mut back = ReadBack {
        next: from,
        ..ReadBack::default()
    };
    let mut line = String::new();
    loop {
        line.clear();
        let read = reader.read_line(&mut line)?;
        if read == 0 || !line.ends_with('\n') {
            break;
        }
        back.next = back.next.saturating_add(read as u64);
        let entry = serde_json::from_str::<TranscriptLine>(line.trim_end()).unwrap_or_else(|e| {
            TranscriptLine {
                at_ms: 0,
                kind: TranscriptKind::Step,
                text: format!("(an unreadable transcript line: {e})"),
            }
        });
        back.ended |= entry.kind == TranscriptKind::End;
        back.entries.push(entry);
    }
    Ok(back)
}

/// The attempts of `task` in `run` that have a transcript, oldest first.
pub fn attempts(root: &Path, run: RunId, task: &TaskId) -> Vec<u32> {
    let prefix = format!("{task}-a");
    let mut found: Vec<u32> = std::fs::read_dir(root.join(run.to_string()))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            name.strip_prefix(&prefix)?
                .strip_suffix(".jsonl")?
                .parse()
                .ok()
        })
        .collect();
    found.sort_unstable();
    found
}

/// Returns once the attempt at `path` is no longer open ([`TranscriptStore::is_open`]),
/// waking on the writer's watch; at most 10 s.
#[cfg(test)]
pub(crate) async fn until_closed(store: &TranscriptStore, path: &Path) {
    let mut written = store.subscribe();
    let closed = async {
        while store.is_open(path) {
            written.changed().await.expect("the writer is alive");
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), closed)
        .await
        .expect("the attempt was closed");
}

#[cfg(test)]
#[path = "transcripts_tests.rs"]
mod tests;
