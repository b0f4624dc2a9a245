use super::*;

/// Reads the transcript once its `end` entry is written, waking on the writer's watch.
async fn when_ended(store: &TranscriptStore, path: &Path) -> ReadBack {
    let mut written = store.subscribe();
    loop {
        written.borrow_and_update();
        if let Ok(back) = read_from(path, 0)
            && back.ended
        {
            return back;
        }
        written.changed().await.expect("the writer is alive");
    }
}

#[tokio::test]
async fn an_attempt_s_entries_are_kept_in_order_and_end() {
    let dir = tempfile::tempdir().unwrap();
    let store = TranscriptStore::start(dir.path().join("transcripts"), DEFAULT_CAP_BYTES).unwrap();
    let (run, task) = (RunId::generate(), "t4.2".parse::<TaskId>().unwrap());
    let sink = store.transcripts().open(run, &task, 2);
    sink.record(TranscriptKind::Prompt, "do the task");
    sink.record(TranscriptKind::ToolCall, "run {\"command\": \"ls\"}");
    sink.record(TranscriptKind::ToolResult, "\u{1b}]0;owned\u{7}src\n");
    sink.end();
    let path = store.path(run, &task, 2);
    assert!(path.ends_with(format!("{run}/t4.2-a2.jsonl")));
    let back = when_ended(&store, &path).await;
    let kinds: Vec<_> = back.entries.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [
            TranscriptKind::Prompt,
            TranscriptKind::ToolCall,
            TranscriptKind::ToolResult,
            TranscriptKind::End
        ]
    );
    // Stored as written: escaping is the reader's (the CLI's) job.
    assert_eq!(back.entries[2].text, "\u{1b}]0;owned\u{7}src\n");
    assert_eq!(attempts(store.root(), run, &task), [2]);
    // Read from where the last read stopped: nothing new.
    let again = read_from(&path, back.next).unwrap();
    assert!(again.entries.is_empty());
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "only the daemon's user reads transcripts");
}

#[tokio::test]
async fn a_huge_output_is_cut_and_the_file_stops_at_its_cap() {
    let dir = tempfile::tempdir().unwrap();
    let cap = 256 * 1024;
    let store = TranscriptStore::start(dir.path().join("transcripts"), cap).unwrap();
    let (run, task) = (RunId::generate(), "t1".parse::<TaskId>().unwrap());
    let sink = store.transcripts().open(run, &task, 1);
    let huge = "é".repeat(3 * 1024 * 1024); // 6 MiB, two bytes a character
    for _ in 0..20 {
        sink.record(TranscriptKind::ToolResult, &huge);
    }
    sink.end();
    let path = store.path(run, &task, 1);
    let back = when_ended(&store, &path).await;
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(size <= cap + 1024, "{size} bytes kept with a cap of {cap}");
    let first = &back.entries[0];
    assert!(
        first.text.len() < ENTRY_CAP_BYTES + 100,
        "{}",
        first.text.len()
    );
    assert!(first.text.ends_with("more bytes cut from this entry]"));
    let kinds: Vec<_> = back.entries.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == TranscriptKind::Truncated)
            .count(),
        1,
        "{kinds:?}"
    );
    assert_eq!(kinds.last(), Some(&TranscriptKind::End));
}

#[tokio::test]
async fn a_write_error_does_not_reach_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    // The root is a file: nothing can be made below it.
    let root = dir.path().join("transcripts");
    std::fs::write(&root, "not a directory").unwrap();
    let store = TranscriptStore::start(root, DEFAULT_CAP_BYTES).unwrap();
    let (run, task) = (RunId::generate(), "t1".parse::<TaskId>().unwrap());
    let sink = store.transcripts().open(run, &task, 1);
    let mut written = store.subscribe();
    written.borrow_and_update();
    sink.record(TranscriptKind::Prompt, "hello");
    sink.end();
    written.changed().await.unwrap();
    assert!(read_from(&store.path(run, &task, 1), 0).is_err());
}

#[tokio::test]
async fn an_attempt_stays_open_until_its_last_sink_is_gone_and_its_end_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let store = TranscriptStore::start(dir.path().join("transcripts"), DEFAULT_CAP_BYTES).unwrap();
    let (run, task) = (RunId::generate(), "t3".parse::<TaskId>().unwrap());
    let path = store.path(run, &task, 1);
    assert!(!store.is_open(&path), "nothing opened yet");
    let sink = store.transcripts().open(run, &task, 1);
    let clone = sink.clone();
    assert!(store.is_open(&path));
    sink.record(TranscriptKind::Step, "hang");
    sink.end();
    drop(sink);
    // A clone (an agent's task) still holds the writer: still open, whatever is written.
    when_ended(&store, &path).await;
    assert!(store.is_open(&path));
    drop(clone);
    // Once it says closed, the `end` is already in the file: read at once, no waiting.
    until_closed(&store, &path).await;
    let back = read_from(&path, 0).unwrap();
    assert!(back.ended);
    // Another attempt of the same task is its own.
    let second = store.transcripts().open(run, &task, 2);
    assert!(!store.is_open(&path));
    assert!(store.is_open(&store.path(run, &task, 2)));
    drop(second);
}

#[tokio::test]
async fn closed_is_only_said_after_every_queued_entry_is_in_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = TranscriptStore::start(dir.path().join("transcripts"), DEFAULT_CAP_BYTES).unwrap();
    let (run, task) = (RunId::generate(), "t1".parse::<TaskId>().unwrap());
    for attempt in 1..=50 {
        let path = store.path(run, &task, attempt);
        let sink = store.transcripts().open(run, &task, attempt);
        for i in 0..20 {
            sink.record(TranscriptKind::Stdout, &format!("line {i}"));
        }
        sink.end();
        drop(sink);
        // Polled without the watch: the first moment it says closed, all of it is there.
        while store.is_open(&path) {
            tokio::task::yield_now().await;
        }
        let back = read_from(&path, 0).unwrap();
        assert_eq!(back.entries.len(), 21, "attempt {attempt}");
        assert!(back.ended, "attempt {attempt}");
    }
}
