use super::*;
use flotilla_actors::protocol::HandoffStatus;

#[test]
fn a_prompts_examples_are_its_fenced_handoffs() {
    let prompt = "Hand back:\n```json\n{\"status\": \"complete\", \"summary\": \"what you did\"}\n```\nNot this:\n```json\n{\"tasks\": []}\n```\nnor ```json\n{\"status\": \"failed\", \"summary\": \" \"}\n```";
    let examples = prompt_examples(prompt);
    assert_eq!(examples.len(), 1, "{examples:?}");
    assert_eq!(examples[0].summary, "what you did");
    let built_in = prompt_examples(include_str!("../../../prompts/worker.md"));
    assert_eq!(built_in.len(), 1);
    assert_eq!(built_in[0].summary, "what you did, for the planner");
}

#[test]
fn the_envelope_is_the_last_json_object_that_is_one() {
    let text = r#"
Here is the example from my instructions:
```json
{"status": "complete", "summary": "what you did, for the planner"}
```
fn main() { let x = {1}; }
Done.
{"status": "partial", "summary": "half of it", "concerns": ["b"],
 "subplan": {"reason": "too_large", "subtasks": [{"description": "rest", "scope": ["src/b.rs"]}]}}
Bye {
"#;
    let args = envelope_in(text).unwrap();
    assert_eq!(args.status, HandoffStatus::Partial);
    assert_eq!(args.summary, "half of it");
    assert_eq!(args.subplan.unwrap().subtasks[0].scope, ["src/b.rs"]);
    assert!(envelope_in("no json {here}").is_none());
    assert!(envelope_in("{\"status\": \"great\", \"summary\": \"\"}").is_none());
    assert_eq!(
        envelope_in("```json\n{\"status\": \"failed\", \"summary\": \"x\"}\n```")
            .unwrap()
            .status,
        HandoffStatus::Failed
    );
}
