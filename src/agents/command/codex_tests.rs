//! Lines as `codex exec --json` prints them (codex-rs `exec_events.rs`; ids shortened):
//! what flotilla reads is typed, and every other event or item kind, now or in a later
//! version, still parses, as `Other`.

use super::*;

fn event(line: &str) -> Event {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

#[test]
fn the_thread_and_turn_events_parse() {
    let started = r#"{"type":"thread.started","thread_id":"0199a213-81c0-7800-8aa1-bbab2a035a53"}"#;
    assert!(matches!(event(started), Event::Other));
    assert!(matches!(
        event(r#"{"type":"turn.started"}"#),
        Event::TurnStarted
    ));
    let completed = r#"{"type":"turn.completed","usage":{"input_tokens":24763,"cached_input_tokens":24448,"output_tokens":122}}"#;
    match event(completed) {
        Event::TurnCompleted { usage } => {
            assert_eq!((usage.input_tokens, usage.output_tokens), (24763, 122));
        }
        other => panic!("{other:?}"),
    }
    let failed = r#"{"type":"turn.failed","error":{"message":"unexpected status 401 Unauthorized: Missing bearer"}}"#;
    match event(failed) {
        Event::TurnFailed { error } => {
            assert_eq!(
                error.message,
                "unexpected status 401 Unauthorized: Missing bearer"
            )
        }
        other => panic!("{other:?}"),
    }
    match event(r#"{"type":"error","message":"Reconnecting... 2/5"}"#) {
        Event::Error(error) => assert_eq!(error.message, "Reconnecting... 2/5"),
        other => panic!("{other:?}"),
    }
    // A kind a later version adds.
    assert!(matches!(
        event(r#"{"type":"thread.compacted","thread_id":"t"}"#),
        Event::Other
    ));
}

#[test]
fn items_give_their_id_and_the_details_flotilla_reads() {
    let command = r#"{"type":"item.started","item":{"id":"item_1","type":"command_execution","command":"bash -lc 'cargo test'","aggregated_output":"","exit_code":null,"status":"in_progress"}}"#;
    match event(command) {
        Event::ItemStarted { item } => {
            assert_eq!(item.id, "item_1");
            assert!(
                matches!(item.details, Details::CommandExecution { command } if command == "bash -lc 'cargo test'")
            );
        }
        other => panic!("{other:?}"),
    }
    let change = r#"{"type":"item.completed","item":{"id":"item_2","type":"file_change","changes":[{"path":"/w/t1-a1/src/a.rs","kind":"update"},{"path":"/w/t1-a1/src/b.rs","kind":"add"}],"status":"completed"}}"#;
    match event(change) {
        Event::ItemCompleted { item } => match item.details {
            Details::FileChange { changes } => {
                let paths: Vec<&str> = changes.iter().map(|c| c.path.as_str()).collect();
                assert_eq!(paths, ["/w/t1-a1/src/a.rs", "/w/t1-a1/src/b.rs"]);
            }
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
    let message = r#"{"type":"item.completed","item":{"id":"item_3","type":"agent_message","text":"Done. {\"status\":\"complete\",\"summary\":\"s\"}"}}"#;
    match event(message) {
        Event::ItemCompleted { item } => assert!(
            matches!(item.details, Details::AgentMessage { text } if text.ends_with("\"summary\":\"s\"}"))
        ),
        other => panic!("{other:?}"),
    }
    let mcp = r#"{"type":"item.completed","item":{"id":"item_4","type":"mcp_tool_call","server":"docs","tool":"search","arguments":{"q":"x"},"result":null,"error":null,"status":"completed"}}"#;
    match event(mcp) {
        Event::ItemCompleted { item } => assert!(
            matches!(item.details, Details::McpToolCall { server, tool } if server == "docs" && tool == "search")
        ),
        other => panic!("{other:?}"),
    }
    let search = r#"{"type":"item.updated","item":{"id":"item_5","type":"web_search","query":"serde other variant"}}"#;
    match event(search) {
        Event::ItemUpdated { item } => assert!(
            matches!(item.details, Details::WebSearch { query } if query == "serde other variant")
        ),
        other => panic!("{other:?}"),
    }
    let error = r#"{"type":"item.completed","item":{"id":"item_6","type":"error","message":"command timed out"}}"#;
    match event(error) {
        Event::ItemCompleted { item } => assert!(
            matches!(item.details, Details::Error { message } if message == "command timed out")
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn item_kinds_flotilla_does_not_read_are_other() {
    for line in [
        r#"{"type":"item.completed","item":{"id":"item_0","type":"reasoning","text":"**Scanning the parser**"}}"#,
        r#"{"type":"item.started","item":{"id":"item_7","type":"todo_list","items":[{"text":"write the test","completed":false}]}}"#,
        r#"{"type":"item.completed","item":{"id":"item_8","type":"collab_tool_call","sender":"a","receivers":[]}}"#,
    ] {
        match event(line) {
            Event::ItemCompleted { item } | Event::ItemStarted { item } => {
                assert!(matches!(item.details, Details::Other), "{line}")
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn an_event_missing_what_flotilla_reads_is_no_event() {
    // A completed turn without usage, an item without an id: not taken for one.
    assert!(serde_json::from_str::<Event>(r#"{"type":"turn.completed"}"#).is_err());
    assert!(
        serde_json::from_str::<Event>(
            r#"{"type":"item.completed","item":{"type":"agent_message","text":"x"}}"#
        )
        .is_err()
    );
    assert!(serde_json::from_str::<Event>("Reading prompt from stdin...").is_err());
}
