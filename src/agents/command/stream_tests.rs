use super::*;

fn roots() -> Vec<PathBuf> {
    vec![PathBuf::from("/w/t1-a1")]
}

fn feed(stream: &mut EventStream, lines: &[&str]) -> Vec<Heard> {
    lines.iter().map(|l| stream.line(l)).collect()
}

/// Issue 20: the running totals were summed over every message id on every line,
/// quadratic in a session's messages. Kept as they change, each message counts once at
/// its largest usage, and every line's report is the growth.
#[test]
fn claude_usage_over_many_messages_is_summed_as_it_changes() {
    let mut s = EventStream::new(OutputFormat::ClaudeStreamJson, roots());
    let messages = 20_000u64;
    let mut reported = 0u64;
    for i in 0..messages {
        for output in [1, 3, 2] {
            let line = format!(
                r#"{{"type":"assistant","message":{{"id":"m{i}","content":[],"usage":{{"input_tokens":10,"output_tokens":{output}}}}}}}"#
            );
            reported += s.line(&line).spent.map_or(0, |b| b.tokens);
        }
    }
    let unnamed = r#"{"type":"assistant","message":{"content":[],"usage":{"input_tokens":7,"output_tokens":0}}}"#;
    reported += s.line(unnamed).spent.map_or(0, |b| b.tokens);
    assert_eq!(reported, messages * 13 + 7);
    assert_eq!(s.tokens().total(), messages * 13 + 7);
}

#[test]
fn claude_events_give_activity_spend_once_and_the_final_text() {
    let mut s = EventStream::new(OutputFormat::ClaudeStreamJson, roots());
    let heard = feed(
        &mut s,
        &[
            r#"{"type":"system","subtype":"init","session_id":"s","model":"m"}"#,
            r#"{"type":"assistant","message":{"id":"m1","content":[{"type":"text","text":"Let me look\nat the   code first, then edit the module that holds the parser and its tests please"}],"usage":{"input_tokens":100,"cache_creation_input_tokens":50,"cache_read_input_tokens":9000,"output_tokens":5}}}"#,
            r#"{"type":"assistant","message":{"id":"m1","content":[{"type":"tool_use","id":"tu1","name":"Edit","input":{"file_path":"/w/t1-a1/src/a.rs","old_string":"a","new_string":"b"}}],"usage":{"input_tokens":100,"cache_creation_input_tokens":50,"output_tokens":20}}}"#,
            "not json at all",
            r#"{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"tu1","content":"ok"}]}}"#,
            r#"{"type":"assistant","message":{"id":"m2","content":[{"type":"tool_use","id":"tu2","name":"Bash","input":{"command":"cargo   test\n-q"}}],"usage":{"input_tokens":200,"output_tokens":10}}}"#,
            r#"{"type":"result","subtype":"success","is_error":false,"result":"Done. {\"status\":\"complete\",\"summary\":\"s\"}","usage":{"input_tokens":400,"cache_creation_input_tokens":50,"output_tokens":40},"total_cost_usd":0.25}"#,
        ],
    );
    let activities: Vec<&String> = heard.iter().flat_map(|h| &h.activities).collect();
    assert_eq!(
        activities,
        [
            "Let me look at the code first, then edit the module that holds the parser and it…",
            "Edit src/a.rs",
            "bash: cargo test -q",
        ]
    );
    let spent: Vec<Option<Budget>> = heard.iter().map(|h| h.spent).collect();
    assert_eq!(spent[0], None);
    assert_eq!(
        spent[1],
        Some(Budget::new(155, Usd::ZERO, 0)),
        "cache reads left out"
    );
    assert_eq!(
        spent[2],
        Some(Budget::new(15, Usd::ZERO, 0)),
        "the same message again: only its growth"
    );
    assert_eq!((spent[3], spent[4]), (None, None));
    assert_eq!(spent[5], Some(Budget::new(210, Usd::ZERO, 0)));
    assert_eq!(
        spent[6],
        Some(Budget::new(490 - 380, Usd::from_dollars(0.25).unwrap(), 0)),
        "the result's totals top up what the messages said"
    );
    assert_eq!(
        s.tokens(),
        Tokens {
            input: 450,
            output: 40
        }
    );
    assert_eq!(s.tool_calls, 2);
    assert_eq!(
        s.verdict(),
        Ok(Some(
            "Done. {\"status\":\"complete\",\"summary\":\"s\"}".to_string()
        ))
    );
    // A result event repeated reports nothing new, and makes the outcome ambiguous:
    // something other than Claude Code printed one of them.
    let again = s.line(r#"{"type":"result","subtype":"success","is_error":false,"result":"{\"status\":\"complete\",\"summary\":\"x\"}","usage":{"input_tokens":400,"output_tokens":40},"total_cost_usd":0.25}"#);
    assert_eq!(again.spent, None);
    assert_eq!(
        s.verdict(),
        Err(StreamEnd::Unfinished(
            "printed 2 result events where a session has one".into()
        ))
    );
}

#[test]
fn a_claude_stream_ends_well_only_with_one_successful_result_event() {
    let mut s = EventStream::new(OutputFormat::ClaudeStreamJson, roots());
    s.line(r#"{"type":"assistant","message":{"content":[{"type":"text","text":"{\"status\":\"complete\",\"summary\":\"s\"}"}]}}"#);
    assert_eq!(
        s.verdict(),
        Err(StreamEnd::Unfinished(
            "ended without its result event".into()
        )),
        "a message is not the result, whatever it holds"
    );
    // A result without its outcome fields is not taken for one.
    s.line(r#"{"type":"result","result":"{\"status\":\"complete\",\"summary\":\"s\"}"}"#);
    assert!(matches!(s.verdict(), Err(StreamEnd::Unfinished(_))));

    let mut failed = EventStream::new(OutputFormat::ClaudeStreamJson, roots());
    let heard = failed.line(r#"{"type":"result","subtype":"success","is_error":true,"result":"Invalid API key · Please run /login"}"#);
    assert_eq!(
        heard.activities,
        ["error: Invalid API key · Please run /login"]
    );
    assert_eq!(
        failed.verdict(),
        Err(StreamEnd::Failed(
            "error result (success): Invalid API key · Please run /login".into()
        ))
    );
    let mut max_turns = EventStream::new(OutputFormat::ClaudeStreamJson, roots());
    max_turns
        .line(r#"{"type":"result","subtype":"error_max_turns","is_error":false,"num_turns":30}"#);
    assert_eq!(
        max_turns.verdict(),
        Err(StreamEnd::Failed(
            "error result (error_max_turns): no message".into()
        ))
    );
}

/// Issue 25: a server without the Responses API answers Codex's every request with 404;
/// that turn.failed is unservable (not retried), judged on the whole message even when
/// the URL lies past what a reason keeps, and only the first turn.failed counts.
#[test]
fn codex_failing_on_a_404_from_responses_is_unservable() {
    let padding = "x".repeat(CAUSE_CHARS);
    let message = format!("unexpected status 404 Not Found: {padding}, url: http://h/v1/responses");
    let mut s = EventStream::new(OutputFormat::CodexJson, roots());
    s.line(r#"{"type":"turn.started"}"#);
    s.line(
        &serde_json::json!({ "type": "turn.failed", "error": { "message": message } }).to_string(),
    );
    s.line(r#"{"type":"turn.failed","error":{"message":"stream disconnected"}}"#);
    match s.verdict() {
        Err(StreamEnd::Unservable(cause)) => {
            assert!(
                cause.starts_with("turn failed: unexpected status 404"),
                "{cause}"
            )
        }
        other => panic!("expected unservable, got {other:?}"),
    }
    let mut other_404 = EventStream::new(OutputFormat::CodexJson, roots());
    other_404.line(r#"{"type":"turn.failed","error":{"message":"unexpected status 404 Not Found: model gone"}}"#);
    assert!(matches!(other_404.verdict(), Err(StreamEnd::Failed(_))));
    let mut later = EventStream::new(OutputFormat::CodexJson, roots());
    later.line(r#"{"type":"turn.failed","error":{"message":"stream disconnected"}}"#);
    later.line(r#"{"type":"turn.failed","error":{"message":"unexpected status 404 Not Found, url: http://h/v1/responses"}}"#);
    assert!(matches!(later.verdict(), Err(StreamEnd::Failed(_))));
}

#[test]
fn a_codex_turn_that_failed_or_never_ended_has_no_result() {
    let mut failed = EventStream::new(OutputFormat::CodexJson, roots());
    feed(
        &mut failed,
        &[
            r#"{"type":"turn.started"}"#,
            r#"{"type":"item.completed","item":{"id":"i0","type":"agent_message","text":"{\"status\":\"complete\",\"summary\":\"s\"}"}}"#,
            r#"{"type":"error","message":"stream disconnected before completion"}"#,
            r#"{"type":"turn.failed","error":{"message":"unexpected status 500 Internal Server Error: /v1/responses"}}"#,
        ],
    );
    assert_eq!(
        failed.verdict(),
        Err(StreamEnd::Failed(
            "turn failed: unexpected status 500 Internal Server Error: /v1/responses".into()
        ))
    );
    let mut unfinished = EventStream::new(OutputFormat::CodexJson, roots());
    unfinished.line(r#"{"type":"turn.started"}"#);
    unfinished.line(r#"{"type":"item.completed","item":{"id":"i0","type":"agent_message","text":"{\"status\":\"complete\",\"summary\":\"s\"}"}}"#);
    assert_eq!(
        unfinished.verdict(),
        Err(StreamEnd::Unfinished(
            "ended without completing its turn".into()
        ))
    );
    unfinished.line(r#"{"type":"error","message":"Reconnecting... 5/5"}"#);
    assert_eq!(
        unfinished.verdict(),
        Err(StreamEnd::Failed("error: Reconnecting... 5/5".into()))
    );
    let mut silent = EventStream::new(OutputFormat::CodexJson, roots());
    silent.line(r#"{"type":"turn.started"}"#);
    silent.line(r#"{"type":"turn.completed","usage":{"input_tokens":1,"output_tokens":1}}"#);
    assert_eq!(silent.verdict(), Ok(None), "completed with nothing said");
}

#[test]
fn codex_events_give_activity_spend_once_and_the_last_agent_message() {
    let mut s = EventStream::new(OutputFormat::CodexJson, roots());
    let heard = feed(
        &mut s,
        &[
            r#"{"type":"thread.started","thread_id":"th"}"#,
            r#"{"type":"turn.started"}"#,
            r#"{"type":"item.started","item":{"id":"i1","type":"command_execution","command":"bash -lc 'cargo test'","status":"in_progress"}}"#,
            r#"{"type":"item.completed","item":{"id":"i1","type":"command_execution","command":"bash -lc 'cargo test'","exit_code":0,"status":"completed"}}"#,
            r#"{"type":"item.completed","item":{"id":"i2","type":"file_change","changes":[{"path":"/w/t1-a1/src/b.rs","kind":"add"},{"path":"src/c.rs","kind":"update"}]}}"#,
            r#"{"type":"item.completed","item":{"id":"i3","type":"reasoning","text":"hmm"}}"#,
            r#"{"type":"item.completed","item":{"id":"i4","type":"agent_message","text":"first"}}"#,
            r#"{"type":"turn.completed","usage":{"input_tokens":1000,"cached_input_tokens":800,"output_tokens":50}}"#,
            r#"{"type":"item.completed","item":{"id":"i5","type":"agent_message","text":"{\"status\":\"partial\",\"summary\":\"s\"}"}}"#,
            r#"{"type":"turn.completed","usage":{"input_tokens":1500,"cached_input_tokens":900,"output_tokens":80}}"#,
        ],
    );
    let activities: Vec<&String> = heard.iter().flat_map(|h| &h.activities).collect();
    assert_eq!(
        activities,
        [
            "bash: bash -lc 'cargo test'",
            "edit src/b.rs, src/c.rs",
            "first",
            "{\"status\":\"partial\",\"summary\":\"s\"}",
        ]
    );
    let spent: Vec<Budget> = heard.iter().filter_map(|h| h.spent).collect();
    assert_eq!(
        spent,
        [
            Budget::new(1050, Usd::ZERO, 0),
            Budget::new(530, Usd::ZERO, 0)
        ],
        "running totals: only their growth"
    );
    assert_eq!(
        s.tool_calls, 2,
        "a command started and completed is one call"
    );
    assert_eq!(
        s.verdict(),
        Ok(Some(
            "{\"status\":\"partial\",\"summary\":\"s\"}".to_string()
        ))
    );
}

#[test]
fn plain_text_lines_are_activity_and_spend_nothing() {
    let mut s = EventStream::new(OutputFormat::Text, roots());
    let heard = feed(
        &mut s,
        &["  Applied edit to src/a.rs ", "", "Tokens: 2k sent"],
    );
    let activities: Vec<&String> = heard.iter().flat_map(|h| &h.activities).collect();
    assert_eq!(activities, ["Applied edit to src/a.rs", "Tokens: 2k sent"]);
    assert!(heard.iter().all(|h| h.spent.is_none()));
    assert_eq!(s.verdict(), Ok(None));
}

/// aider prints one usage line a model reply, with that message's tokens (reset after each
/// report) and the session's cost so far: the tokens are summed, the cost is the latest
/// session total, and each line reports only what it adds.
#[test]
fn aider_s_usage_lines_are_charged_as_they_come() {
    let mut s = EventStream::new(OutputFormat::Text, roots());
    let heard = feed(
        &mut s,
        &[
            "Tokens: 2.3k sent, 215 received. Cost: $0.0016 message, $0.0016 session.",
            "Applied edit to src/a.rs",
            "Tokens: 3.1k sent, 1.1k cache write, 40 received. Cost: $0.0020 message, $0.0036 session.",
            "Tokens: 99999999999999999999k sent, 1 received.",
        ],
    );
    let spent: Vec<Option<u64>> = heard.iter().map(|h| h.spent.map(|b| b.tokens)).collect();
    assert_eq!(spent, [Some(2_515), None, Some(3_140), None]);
    assert_eq!(s.tokens().total(), 5_655);
    assert_eq!(s.cost, Usd::from_dollars(0.0036).unwrap());
    let activities = heard.iter().map(|h| h.activities.len()).sum::<usize>();
    assert_eq!(activities, 4, "usage lines still show as activity");
}
