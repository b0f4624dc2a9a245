//! Lines as Claude Code 2.x prints them with `-p --output-format stream-json --verbose`
//! (ids and text shortened): what flotilla reads is typed, and everything else it prints,
//! now or in a later version, still parses, as `Other`.

use super::*;

fn event(line: &str) -> Event {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

#[test]
fn the_init_event_and_tool_results_are_other_events() {
    let init = r#"{"type":"system","subtype":"init","cwd":"/w/t1-a1","session_id":"5f1c9d2e","tools":["Task","Bash","Glob","Grep","Read","Edit","Write"],"mcp_servers":[],"model":"claude-sonnet-4-5-20250929","permissionMode":"default","slash_commands":["compact","review"],"apiKeySource":"ANTHROPIC_API_KEY","output_style":"default","uuid":"0b1e"}"#;
    assert!(matches!(event(init), Event::Other));
    let tool_result = r#"{"type":"user","message":{"role":"user","content":[{"tool_use_id":"toolu_01A","type":"tool_result","content":"test result: ok. 3 passed","is_error":false}]},"parent_tool_use_id":null,"session_id":"5f1c9d2e","uuid":"7c2d","tool_use_result":{"stdout":"ok","stderr":"","interrupted":false,"isImage":false}}"#;
    assert!(matches!(event(tool_result), Event::Other));
    // A kind a later version adds.
    let later = r#"{"type":"stream_event","event":{"type":"content_block_delta","index":0},"session_id":"5f1c9d2e"}"#;
    assert!(matches!(event(later), Event::Other));
}

#[test]
fn an_assistant_message_gives_its_id_blocks_and_usage() {
    let line = r#"{"type":"assistant","message":{"id":"msg_01XyZ","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"thinking","thinking":"The parser first.","signature":"EqQB"},{"type":"text","text":"Running the tests."},{"type":"tool_use","id":"toolu_01A","name":"Bash","input":{"command":"cargo test -q","description":"Run the tests"}}],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":4,"cache_creation_input_tokens":6178,"cache_read_input_tokens":11338,"cache_creation":{"ephemeral_5m_input_tokens":6178,"ephemeral_1h_input_tokens":0},"output_tokens":3,"service_tier":"standard"}},"parent_tool_use_id":null,"session_id":"5f1c9d2e","uuid":"9a8b"}"#;
    let Event::Assistant { message } = event(line) else {
        panic!("not an assistant event");
    };
    assert_eq!(message.id.as_deref(), Some("msg_01XyZ"));
    let usage = message.usage.unwrap();
    assert_eq!(
        (
            usage.input_tokens,
            usage.cache_creation_input_tokens,
            usage.output_tokens
        ),
        (4, 6178, 3)
    );
    match message.content.as_slice() {
        [
            Block::Other,
            Block::Text { text },
            Block::ToolUse { id, name, input },
        ] => {
            assert_eq!(text, "Running the tests.");
            assert_eq!(id.as_deref(), Some("toolu_01A"));
            assert_eq!(name, "Bash");
            assert_eq!(input["command"], "cargo test -q");
        }
        other => panic!("unexpected blocks: {other:?}"),
    }
    // A message with neither id, content nor usage is still one.
    assert!(matches!(
        event(r#"{"type":"assistant","message":{}}"#),
        Event::Assistant { message } if message.id.is_none() && message.content.is_empty() && message.usage.is_none()
    ));
}

#[test]
fn the_result_event_gives_the_outcome_text_usage_and_cost() {
    let line = r#"{"type":"result","subtype":"success","is_error":false,"duration_ms":23456,"duration_api_ms":21012,"num_turns":7,"result":"Done. {\"status\":\"complete\",\"summary\":\"s\"}","session_id":"5f1c9d2e","total_cost_usd":0.1234,"usage":{"input_tokens":20,"cache_creation_input_tokens":7000,"cache_read_input_tokens":50000,"output_tokens":900,"server_tool_use":{"web_search_requests":0},"service_tier":"standard"},"modelUsage":{"claude-sonnet-4-5-20250929":{"inputTokens":20,"outputTokens":900,"costUSD":0.1234}},"permission_denials":[],"uuid":"e4f5"}"#;
    let Event::Result(result) = event(line) else {
        panic!("not a result event");
    };
    assert_eq!(result.subtype, "success");
    assert!(!result.is_error);
    assert_eq!(
        result.result.as_deref(),
        Some("Done. {\"status\":\"complete\",\"summary\":\"s\"}")
    );
    let usage = result.usage.unwrap();
    assert_eq!(
        (
            usage.input_tokens,
            usage.cache_creation_input_tokens,
            usage.output_tokens
        ),
        (20, 7000, 900)
    );
    assert_eq!(result.total_cost_usd, Some(0.1234));

    let failed = r#"{"type":"result","subtype":"error_max_turns","is_error":true,"duration_ms":1000,"num_turns":30,"session_id":"5f1c9d2e","total_cost_usd":0.5,"usage":{"input_tokens":1,"output_tokens":2}}"#;
    let Event::Result(failed) = event(failed) else {
        panic!("not a result event");
    };
    assert_eq!(
        (failed.subtype.as_str(), failed.is_error, failed.result),
        ("error_max_turns", true, None)
    );
}

#[test]
fn a_result_without_its_outcome_fields_is_no_event() {
    // Not passed over as `Other`: a line that claims to be the result but is not one
    // must not parse at all, so that the stream never takes it for the session's end.
    assert!(serde_json::from_str::<Event>(r#"{"type":"result","result":"done"}"#).is_err());
    assert!(serde_json::from_str::<Event>(r#"{"type":"result","subtype":"success"}"#).is_err());
    assert!(serde_json::from_str::<Event>(r#"{"no_type":1}"#).is_err());
    assert!(serde_json::from_str::<Event>("Welcome to Claude Code").is_err());
}
