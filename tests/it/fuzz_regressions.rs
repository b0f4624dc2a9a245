//! Regression tests for what fuzzing found (issue 11; the targets are in fuzz/). Each input
//! is the fuzzer's minimized case, or the smallest hand-written form of it, and each test
//! asserts the behaviour the fix gives, so that it runs on stable in CI.

use flotilla::client::{ClientError, parse_events};
use flotilla_actors::protocol::{Event, EventKind, RunId};
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
