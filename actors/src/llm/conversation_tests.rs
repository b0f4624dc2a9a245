use super::*;
use crate::ports::ToolCall;

fn budget(max_bytes: usize, keep_recent: usize) -> ContextBudget {
    ContextBudget {
        max_bytes,
        max_tokens: u64::MAX / 8,
        keep_recent,
    }
}

fn answer(scratchpad: &str, tasks: usize) -> String {
    let tasks: Vec<serde_json::Value> = (0..tasks)
        .map(|i| serde_json::json!({"description": format!("task {i}"), "scope": [format!("src/m{i}.rs")]}))
        .collect();
    serde_json::json!({"scratchpad": scratchpad, "tasks": tasks}).to_string()
}

fn used(prompt: &str, answer: String) -> Exchange {
    Exchange::new(prompt.into(), answer, None)
}

fn texts(request: &BuiltRequest) -> Vec<&str> {
    request
        .messages
        .iter()
        .map(|m| m.content.as_str())
        .collect()
}

#[test]
fn an_excerpt_keeps_head_and_tail_within_the_size_and_is_stable() {
    let text = format!("{}{}", "a".repeat(5_000), "é".repeat(2_000));
    let cut = excerpt(&text, 1_000);
    assert!(cut.len() <= 1_000, "{}", cut.len());
    assert!(cut.starts_with("aaa") && cut.ends_with('é'));
    assert!(cut.contains("bytes omitted"), "{cut}");
    assert_eq!(excerpt(&cut, 1_000), cut, "cutting again changes nothing");
    assert_eq!(excerpt("short", 10), "short");
    assert!(
        excerpt(&"é".repeat(100), 7).len() <= 7,
        "tiny caps cut on a character"
    );
}

#[test]
fn water_fill_keeps_small_parts_whole_and_shares_the_rest() {
    assert_eq!(water_fill(&[10, 20], 100), vec![10, 20]);
    assert_eq!(water_fill(&[10, 500, 900], 310), vec![10, 150, 150]);
    assert_eq!(water_fill(&[0, 0], 0), vec![0, 0]);
}

#[test]
fn the_token_budget_binds_at_four_bytes_a_token_and_compactions_are_bounded() {
    let b = ContextBudget {
        max_bytes: 1_000_000,
        max_tokens: 1_000,
        keep_recent: 2,
    };
    assert_eq!(b.limit(), 4_000);
    assert_eq!(halved(usize::MAX, 3_000), 1_500);
    assert_eq!(
        halved(1_000, 3_000),
        1_000,
        "never above the ceiling before"
    );
    let mut c = BoundedConversation::new(b, 10_000);
    for _ in 0..MAX_COMPACTIONS {
        assert!(c.compact());
    }
    assert!(!c.compact(), "compaction is bounded");
}

/// The request is the first message, the newest exchanges and the new prompt; the ones in
/// between are omitted, and the scratchpad they carried is restated.
#[test]
fn a_request_carries_the_first_message_the_last_exchanges_and_the_latest_scratchpad() {
    let mut c = BoundedConversation::new(budget(1_000_000, 2), 100_000);
    c.record(used("FIRST", answer("pad 1", 1)));
    c.record(used("second", answer("pad 2", 1)));
    c.record(used("third", answer("pad 3", 1)));
    c.record(used("fourth", answer("pad 4", 1)));
    let r = c.request("SYSTEM", "fifth");
    let t = texts(&r);
    assert_eq!(t[0], "SYSTEM");
    assert_eq!(t[1], "FIRST");
    assert!(t[2].contains("2 of the 4 earlier answers"), "{}", t[2]);
    assert!(
        !t[2].contains("pad"),
        "the latest scratchpad is shown in its own answer"
    );
    assert_eq!(
        &t[3..],
        [
            "third",
            &answer("pad 3", 1),
            "fourth",
            &answer("pad 4", 1),
            "fifth"
        ]
    );
    assert_eq!(r.omitted, 2);
    assert_eq!(c.scratchpad(), Some("pad 4"));
}

#[test]
fn a_short_conversation_is_sent_whole_in_order() {
    let mut c = BoundedConversation::new(budget(1_000_000, 4), 100_000);
    assert_eq!(texts(&c.request("S", "one")), ["S", "one"]);
    c.record(used("one", answer("p", 0)));
    c.record(used("two", answer("q", 0)));
    let r = c.request("S", "three");
    assert_eq!(
        texts(&r),
        ["S", "one", &answer("p", 0), "two", &answer("q", 0), "three"]
    );
    assert_eq!(r.omitted, 0);
}

/// An unusable answer is kept as an excerpt with the reason, and its scratchpad (none) does
/// not replace the carried one; a refused batch is cut the same way after the fact.
#[test]
fn unused_answers_are_kept_as_excerpts_with_their_reason() {
    let mut c = BoundedConversation::new(budget(1_000_000, 1), 1_000_000);
    c.record(used("first", answer("good pad", 1)));
    let huge = "x".repeat(8 * 1024 * 1024);
    let bad = Exchange::new("second".into(), huge, Some("not JSON".into()));
    assert!(bad.answer.len() <= UNUSED_ANSWER_BYTES);
    c.record(bad);
    let refused = answer("refused pad", 2_000);
    c.record(used("third", refused.clone()));
    assert_eq!(c.scratchpad(), Some("refused pad"));
    c.mark_last_unused("the batch was refused: a cycle".into());
    assert_eq!(
        c.scratchpad(),
        Some("good pad"),
        "back to the last used one"
    );
    let r = c.request("S", "fourth");
    let t = texts(&r);
    assert!(t[2].contains("good pad"), "carried: {}", t[2]);
    assert!(t[4].starts_with("[flotilla: this answer was not used: the batch was refused"));
    assert!(t[4].len() < UNUSED_ANSWER_BYTES + 2_000, "{}", t[4].len());
    assert!(refused.len() > 50_000);
}

/// A request never exceeds the limit, however large the first message, the prompt or the
/// answers; the parts that cannot be dropped are cut.
#[test]
fn a_request_stays_within_the_limit_whatever_its_parts_weigh() {
    let limit = 20_000;
    let mut c = BoundedConversation::new(budget(limit, 4), 1_000_000);
    c.record(used(&"F".repeat(100_000), answer(&"s".repeat(100_000), 3)));
    for i in 0..10 {
        c.record(used(
            &format!("p{i}{}", "y".repeat(9_000)),
            answer("pad", 40),
        ));
    }
    let r = c.request(&"S".repeat(1_000), &"N".repeat(50_000));
    assert!(r.bytes() <= limit, "{}", r.bytes());
    assert!(r.prompt.len() < 50_000 && r.prompt.contains("bytes omitted"));
    assert_eq!(r.messages.last().unwrap().content, r.prompt);
    // A system prompt larger than the limit leaves the rest its floor.
    let r = c.request(&"S".repeat(30_000), "small");
    assert!(r.bytes() <= 30_000 + MIN_REST_BYTES, "{}", r.bytes());
}

#[test]
fn compaction_halves_what_the_next_request_carries_from_the_refused_size() {
    let mut c = BoundedConversation::new(budget(64_000, 8), 100_000);
    for i in 0..8 {
        c.record(used(
            &format!("p{i}{}", "y".repeat(4_000)),
            answer("pad", 10),
        ));
    }
    let before = c.request("S", "next").bytes();
    assert!(c.compact());
    let after = c.request("S", "next").bytes();
    assert!(after <= before / 2, "{before} → {after}");
}

#[test]
fn a_resumed_conversation_builds_the_same_request() {
    let exchanges: Vec<Exchange> = (0..6)
        .map(|i| used(&format!("p{i}"), answer(&format!("pad {i}"), 1)))
        .collect();
    let mut live = BoundedConversation::new(budget(1_000_000, 2), 100_000);
    for e in exchanges.clone() {
        live.record(e);
    }
    let mut resumed = BoundedConversation::resume(budget(1_000_000, 2), 100_000, exchanges);
    assert_eq!(resumed.calls(), 6);
    assert_eq!(resumed.request("S", "x"), live.request("S", "x"));
}

fn tool_turn(id: &str, output: usize) -> Vec<ChatMessage> {
    vec![
        ChatMessage::assistant_calls(
            "reading",
            vec![ToolCall {
                id: id.into(),
                name: "read_file".into(),
                arguments: "{\"path\":\"a\"}".into(),
            }],
        ),
        ChatMessage::tool_result(id, "o".repeat(output)),
    ]
}

#[test]
fn old_tool_outputs_are_summarized_before_anything_is_dropped() {
    let mut m = vec![ChatMessage::system("s"), ChatMessage::user("task")];
    for i in 0..4 {
        m.extend(tool_turn(&i.to_string(), 1_000));
    }
    let mut dropped = 0;
    compact_turns(&mut m, 2, 2_500, 1, &mut dropped);
    assert_eq!(m.len(), 10, "no turn dropped");
    assert!(
        m[3].content
            .starts_with("[compacted: 1000 bytes of tool output; it began: ooo")
    );
    assert_eq!(m[9].content.len(), 1_000, "the newest output stays whole");
    assert_eq!(dropped, 0);
}

#[test]
fn whole_old_turns_are_dropped_when_summaries_are_not_enough() {
    let mut m = vec![ChatMessage::system("s"), ChatMessage::user("task")];
    for i in 0..30 {
        m.extend(tool_turn(&i.to_string(), 500));
    }
    let mut dropped = 0;
    compact_turns(&mut m, 2, 3_000, 2, &mut dropped);
    let bytes: usize = m.iter().map(message_bytes).sum();
    assert!(bytes <= 3_000, "{bytes}");
    assert!(dropped > 0);
    assert_eq!(m[1].content, "task");
    assert_eq!(
        m[2].role,
        ChatRole::Assistant,
        "a kept turn starts the rest"
    );
    assert_eq!(
        m[3].tool_call_id,
        m[2].tool_calls.first().map(|c| c.id.clone())
    );
    assert!(
        m[3].content
            .starts_with(&format!("[flotilla: {dropped} earlier turns"))
    );
    // Later compactions count on.
    let before = dropped;
    m.extend(tool_turn("x", 2_000));
    compact_turns(&mut m, 2, 3_000, 2, &mut dropped);
    assert!(dropped > before);
    assert_eq!(
        m.iter()
            .filter(|x| x.content.contains("earlier turns"))
            .count(),
        1
    );
}

#[test]
fn a_last_turn_larger_than_the_limit_is_cut_to_fit() {
    let mut m = vec![ChatMessage::system("s"), ChatMessage::user("task")];
    m.extend(tool_turn("1", 100_000));
    let mut dropped = 0;
    compact_turns(&mut m, 2, 4_000, 4, &mut dropped);
    let bytes: usize = m.iter().map(message_bytes).sum();
    assert!(bytes <= 4_000, "{bytes}");
    assert!(m[3].content.contains("bytes omitted"));
}
