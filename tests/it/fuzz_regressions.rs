//! Regression tests for what fuzzing found (issue 11; the targets are in fuzz/). Each input
//! is the fuzzer's minimized case, or the smallest hand-written form of it, and each test
//! asserts the behaviour the fix gives, so that it runs on stable in CI.
//!
//! Covered: ids as deep as limits allow round-tripping through JSON and SQLite for every event
//! kind, scope normalization, the BOM, fence-first parsing, the provider stream seeds split
//! to single bytes.

use std::sync::Arc;

use flotilla::cli::client::{ClientError, parse_events};
use flotilla::journal::{RunRecord, SqliteJournal};
use flotilla_actors::config::{Limits, LimitsError};
use flotilla_actors::llm::output::{PlannerOutput, parse_json_answer};
use flotilla_actors::ports::{Journal, SystemClock};
use flotilla_actors::protocol::ScopePath;
use flotilla_actors::protocol::{Event, EventKind, MAX_TASK_DEPTH, PathProblem, RunId, TaskId};
use futures::StreamExt;

/// One SSE frame carrying `kind` as event `seq`.
fn frame(seq: u64, kind: EventKind) -> (Event, String) {
    let event = Event {
        seq,
        run: RunId::generate(),
        at_ms: 1,
        kind,
    };
    let text = format!(
        "id: {seq}\nevent: {}\ndata: {}\n\n",
        event.kind.name(),
        serde_json::to_string(&event).unwrap()
    );
    (event, text)
}

/// Parses `chunks` as the client parses an event stream.
fn parse(chunks: Vec<Vec<u8>>) -> Vec<Result<Event, ClientError>> {
    let stream = futures::stream::iter(chunks.into_iter().map(Ok::<_, String>));
    futures::executor::block_on(parse_events(stream).collect())
}

fn ok(results: Vec<Result<Event, ClientError>>) -> Vec<Event> {
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

/// eventsource-stream 0.2.3 sliced one byte of the three-byte BOM (`&text[1..]`) and
/// panicked: "byte index 1 is not a char boundary".
#[test]
fn an_event_stream_may_start_with_a_byte_order_mark() {
    let (first, one) = frame(1, EventKind::PlanningFinished);
    let (second, two) = frame(
        2,
        EventKind::RunStarted {
            request: "ü".into(),
            sandbox: None,
        },
    );
    let body = format!("\u{feff}: keep-alive\n\n{one}{two}").into_bytes();
    assert_eq!(
        ok(parse(vec![body.clone()])),
        vec![first.clone(), second.clone()]
    );
    // However the BOM is split across chunks, even one byte at a time.
    for split in 1..=4 {
        let chunks = vec![body[..split].to_vec(), body[split..].to_vec()];
        assert_eq!(ok(parse(chunks)), vec![first.clone(), second.clone()]);
    }
    let bytewise: Vec<Vec<u8>> = body.iter().map(|b| vec![*b]).collect();
    assert_eq!(ok(parse(bytewise)), vec![first.clone(), second.clone()]);
    // Empty chunks before and between the BOM's bytes change nothing.
    let spaced = vec![
        Vec::new(),
        body[..1].to_vec(),
        Vec::new(),
        body[1..2].to_vec(),
        body[2..].to_vec(),
    ];
    assert_eq!(ok(parse(spaced)), vec![first, second]);
}

#[test]
fn only_one_byte_order_mark_is_dropped_and_a_second_does_not_panic() {
    // The SSE spec drops one BOM; a second one is part of the first line's field name, so
    // that line is an unknown field and ignored, and the frame has no data.
    let (first, _) = frame(1, EventKind::PlanningFinished);
    let (second, two) = frame(2, EventKind::PlanningFinished);
    let one = serde_json::to_string(&first).unwrap();
    let body = format!("\u{feff}\u{feff}data: {one}\n\n{two}").into_bytes();
    let events = parse(vec![body]);
    let parsed: Vec<&Event> = events.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(parsed, vec![&second]);
}

#[test]
fn a_stream_that_is_only_part_of_a_byte_order_mark_is_an_error_not_a_panic() {
    for partial in [&b"\xEF"[..], b"\xEF\xBB", b"\xEF\xBBdata: x\n\n"] {
        let results = parse(vec![partial.to_vec()]);
        assert!(
            results.iter().all(Result::is_err),
            "{partial:?} must not parse as events: {results:?}"
        );
    }
    assert!(parse(vec![b"\xEF\xBB\xBF".to_vec()]).is_empty());
    assert!(parse(Vec::new()).is_empty());
}

/// Fuzz finding (target `planner_answer`, issue 11): the parser looked for a Markdown fence
/// before trying the whole text, so a valid pretty-printed answer whose descriptions mention
/// ```` ``` ```` was cut between those two fences and refused. The whole text must be taken
/// when it is valid JSON, with the fences inside its strings kept verbatim.
#[test]
fn a_valid_planner_answer_whose_strings_mention_a_fence_is_taken_whole() {
    let answer = r#"{
  "scratchpad": "two docs tasks",
  "tasks": [
    {"description": "show the example in a ```rust block", "scope": ["a.md"]},
    {"description": "close the block with ``` on its own line", "scope": ["b.md"]}
  ]
}"#;
    let compact: String = answer.lines().map(str::trim).collect();
    for text in [answer.to_string(), compact, format!("\n  {answer}\n")] {
        let out: PlannerOutput = parse_json_answer(&text, 10_000)
            .unwrap_or_else(|e| panic!("refused a valid answer: {e}\n{text}"));
        assert_eq!(out.scratchpad.as_deref(), Some("two docs tasks"));
        let descriptions: Vec<&str> = out.tasks.iter().map(|t| t.description.as_str()).collect();
        assert_eq!(
            descriptions,
            [
                "show the example in a ```rust block",
                "close the block with ``` on its own line"
            ]
        );
        assert_eq!(out.tasks[1].scope, ["b.md"]);
    }
    // The fence is still stripped when the JSON really is inside one.
    let fenced = "Here is the plan:\n```json\n{\"tasks\": []}\n```\n";
    let out: PlannerOutput = parse_json_answer(fenced, 10_000).unwrap();
    assert!(out.tasks.is_empty());
}

/// A task id `depth` levels deep, every number the largest there is.
fn deep_id(depth: u32) -> TaskId {
    let mut id = TaskId::root(u32::MAX);
    while id.depth() < depth {
        id = id.child(u32::MAX);
    }
    id
}

/// One event of every kind about task `t` (the protocol's own samples, which its unit test
/// keeps complete).
fn one_of_each(t: &TaskId) -> Vec<EventKind> {
    EventKind::samples(t)
}

/// Fuzz finding (target `task_graph`, issue 11): with `max_depth` above what a task id
/// holds, a subplan 17 levels deep was journaled with an id that `TaskId` refuses to parse,
/// so the run's journal no longer read back. Every depth that `Limits::validate` accepts
/// must round-trip through the journal's JSON encoding, for every event kind; the first
/// depth ids cannot hold (17) must be refused by `Limits::validate`.
#[test]
fn every_event_kind_about_the_deepest_task_limits_allow_round_trips_through_json() {
    let kinds: std::collections::BTreeSet<&str> = one_of_each(&TaskId::root(1))
        .iter()
        .map(EventKind::name)
        .collect();
    assert_eq!(
        kinds.len(),
        one_of_each(&TaskId::root(1)).len(),
        "one of each"
    );
    assert_eq!(
        kinds.len(),
        one_of_each(&TaskId::root(1)).len(),
        "one of each"
    );

    let mut deepest_allowed = 0;
    for depth in 1..=MAX_TASK_DEPTH + 4 {
        let limits = Limits {
            max_depth: depth,
            ..Limits::default()
        };
        if limits.validate().is_err() {
            continue;
        }
        deepest_allowed = depth;
        let id = deep_id(depth);
        let text = serde_json::to_string(&id).unwrap();
        assert_eq!(serde_json::from_str::<TaskId>(&text).unwrap(), id, "{text}");
        for kind in one_of_each(&id) {
            let event = Event {
                seq: u64::MAX,
                run: RunId::generate(),
                at_ms: u64::MAX,
                kind,
            };
            let json = serde_json::to_string(&event.kind).unwrap();
            let back: EventKind = serde_json::from_str(&json)
                .unwrap_or_else(|e| panic!("depth {depth}: {json} does not read back: {e}"));
            assert_eq!(back, event.kind, "depth {depth}");
            let json = serde_json::to_string(&event).unwrap();
            assert_eq!(serde_json::from_str::<Event>(&json).unwrap(), event);
        }
    }
    assert_eq!(deepest_allowed, MAX_TASK_DEPTH);
    let seventeen = Limits {
        max_depth: 17,
        ..Limits::default()
    };
    assert_eq!(MAX_TASK_DEPTH + 1, 17);
    assert_eq!(
        seventeen.validate(),
        Err(LimitsError::DepthBeyondTaskId {
            max_depth: 17,
            max: MAX_TASK_DEPTH
        })
    );
}

/// The same finding through the real journal: one event of every kind about a task at the
/// deepest depth limits allow is appended to a `SqliteJournal` and read back unchanged (a
/// row that does not decode would make the run damaged at the next start).
#[tokio::test]
async fn every_event_kind_about_the_deepest_task_reads_back_from_the_sqlite_journal() {
    let dir = tempfile::tempdir().unwrap();
    let journal =
        SqliteJournal::open(&dir.path().join("journal.sqlite"), Arc::new(SystemClock)).unwrap();
    let run = RunId::generate();
    let started = journal
        .create_run(RunRecord {
            id: run,
            request: "deep".into(),
            repo: "/tmp".into(),
            config: serde_json::Value::Null,
            created_ms: 0,
            outcome: None,
        })
        .await
        .unwrap();
    let deepest = deep_id(MAX_TASK_DEPTH);
    assert_eq!(
        Limits {
            max_depth: deepest.depth(),
            ..Limits::default()
        }
        .validate(),
        Ok(())
    );
    let appended = journal.append(run, one_of_each(&deepest)).await.unwrap();
    assert_eq!(appended.len(), one_of_each(&deepest).len());
    let read = journal.read(run, 0).await.unwrap();
    assert_eq!(read.first(), Some(&started));
    assert_eq!(read[1..], appended[..]);
    let kinds: Vec<EventKind> = read[1..].iter().map(|e| e.kind.clone()).collect();
    assert_eq!(kinds, one_of_each(&deepest));
}

/// Fuzz finding (target `task_graph`, issue 11): scope normalization was not idempotent.
/// `"s /"` was stored as `"s "`, which parses to `"s"`: what was validated (and locked) was
/// not what a replay rebuilt, and `"src/a /"` did not overlap `"src/a"`. Whitespace is now
/// trimmed around every component: the stored form parses to itself.
#[test]
fn scope_paths_normalize_once_and_the_stored_form_parses_to_itself() {
    let cases = [
        ("s /", "s"),
        ("src/a /", "src/a"),
        (" a//b/ ", "a/b"),
        ("./x", "x"),
        ("./src//lib.rs", "src/lib.rs"),
        (" src / a b .rs ", "src/a b .rs"),
        ("src/ . /x", "src/x"),
        ("x/./y/", "x/y"),
        ("a\u{a0}/\u{a0}b", "a/b"),
    ];
    for (raw, stored) in cases {
        let once = ScopePath::parse(raw, 1024).unwrap_or_else(|e| panic!("{raw:?}: {e}"));
        assert_eq!(once.as_str(), stored, "{raw:?}");
        let twice = ScopePath::parse(once.as_str(), 1024).unwrap();
        assert_eq!(
            twice, once,
            "{raw:?} is stored as {once:?}, which parses to {twice:?}"
        );
        // And through the journal's JSON encoding.
        let json = serde_json::to_string(&once).unwrap();
        assert_eq!(serde_json::from_str::<ScopePath>(&json).unwrap(), once);
    }
    let p = |s: &str| ScopePath::parse(s, 1024).unwrap();
    assert!(p("src/a /").overlaps(&p("src/a")));
    assert!(p("src/a").overlaps(&p("src/a /")));
    assert!(p("src/a /").covers(&p("src/a/b.rs")));
    assert!(!p("src/a /").overlaps(&p("src/ab")));
    // What is refused once trimmed is refused, not stored in a form that reads differently.
    for (raw, problem) in [
        (".git /", PathProblem::GitDirectory),
        ("..  /", PathProblem::ParentTraversal),
        ("src/ .. /x", PathProblem::ParentTraversal),
        ("  . /  ", PathProblem::Empty),
        ("./~/x", PathProblem::Absolute),
        (". /C:/x", PathProblem::Absolute),
    ] {
        assert_eq!(ScopePath::parse(raw, 1024), Err(problem), "{raw:?}");
    }
}

/// The `provider_stream` target's invariant on its seeds (fuzz/seeds/provider_stream: each
/// file's first byte picks the format, even = OpenAI, odd = Anthropic): a streamed answer
/// assembles to the same thing however its body is split, down to one byte per chunk, and
/// the whole-body seeds parse.
#[test]
fn provider_stream_seeds_assemble_the_same_however_they_are_split() {
    use flotilla::providers::endpoint::{parse_stream_chunks, parse_whole_body};
    use flotilla::providers::wire::WireFormat;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/provider_stream");
    let mut streams = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let (seed, body) = data.split_first().unwrap();
        let format = if seed & 1 == 0 {
            WireFormat::OpenAi
        } else {
            WireFormat::Anthropic
        };
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with("-whole") {
            let answer = parse_whole_body(format, std::str::from_utf8(body).unwrap())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(!answer.content.is_empty(), "{name}");
            continue;
        }
        let whole = parse_stream_chunks(format, vec![body.to_vec()]);
        let bytewise = parse_stream_chunks(format, body.iter().map(|b| vec![*b]).collect());
        assert_eq!(whole, bytewise, "{name}: the split changed the answer");
        streams += 1;
    }
    assert!(streams >= 3);
}

/// Issue 20: a streamed OpenAI tool call at index 2^64−1 followed by one with no index and
/// a new id computed `last + 1` and panicked (in release, it wrapped to 0 and merged the
/// calls). It is a malformed answer (fuzz/seeds/provider_stream/openai-index-max).
#[test]
fn a_tool_call_after_one_at_the_largest_index_is_a_malformed_answer_not_a_panic() {
    use flotilla::providers::endpoint::parse_stream_chunks;
    use flotilla::providers::wire::WireFormat;
    use flotilla_actors::ports::LlmError;
    let seed = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/seeds/provider_stream/openai-index-max");
    let data = std::fs::read(seed).unwrap();
    let body = data[1..].to_vec();
    match parse_stream_chunks(WireFormat::OpenAi, vec![body.clone()]) {
        Err(LlmError::Malformed(message)) => {
            assert!(message.contains("18446744073709551615"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    // The same index with the same call's id, or no id, continues that call: no overflow.
    let text = String::from_utf8(body)
        .unwrap()
        .replace("\"id\":\"b\",", "");
    let answer = parse_stream_chunks(WireFormat::OpenAi, vec![text.into_bytes()]).unwrap();
    assert_eq!(answer.tool_calls.len(), 1);
    assert_eq!(answer.tool_calls[0].arguments, "{}{}");
}
