//! Parsing what LLMs answer. Their output is untrusted input: bounded in size, stripped of
//! the Markdown fences models like to add, parsed into typed structs, and refused with a
//! reason a human (and the model, on its next call) can act on.
//!
//! Order: a size cap, the whole text tried as JSON first, then fences stripped, then typed
//! structs (`PlannerOutput`). Ids a model invents are ignored, because nothing reads them.

use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::protocol::TaskSpec;

/// The root planner's answer (prompts/root-planner.md).
/// Unknown fields are ignored: in particular any `id` or `branch` a model invents is never
/// read, because flotilla names things itself.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct PlannerOutput {
    #[serde(default)]
    pub scratchpad: Option<String>,
    pub tasks: Vec<TaskSpec>,
}

/// The JSON Schema of [`PlannerOutput`], sent with planner calls so that servers able to
/// constrain their output (the llama.cpp family) answer in the right shape. The answer is
/// parsed and validated like any other: the schema helps a model, it protects nothing.
pub fn planner_answer_schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "scratchpad": { "type": "string" },
            "tasks": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "description": { "type": "string", "minLength": 1 },
                        "scope": {
                            "type": "array",
                            "items": { "type": "string", "minLength": 1 },
                            "minItems": 1
                        },
                        "acceptance": { "type": "string", "minLength": 1 },
                        "priority": { "type": "integer", "minimum": 1, "maximum": 10 },
                        "dependencies": {
                            "type": "array",
                            "items": {
                                "anyOf": [
                                    { "type": "integer", "minimum": 0 },
                                    { "type": "string" }
                                ]
                            }
                        }
                    },
                    "required": ["description", "scope", "acceptance"]
                }
            }
        },
        "required": ["scratchpad", "tasks"]
    })
}

/// Parses one JSON object out of an LLM answer: the whole text, or else the text inside a
/// ```` ```json ```` fence, or else from the first `{` to the last `}`. The whole text comes
/// first: a valid answer whose strings mention a fence must not be cut at that fence.
pub fn parse_json_answer<T: DeserializeOwned>(
    content: &str,
    max_bytes: usize,
) -> Result<T, AnswerError> {
    if content.len() > max_bytes {
        return Err(AnswerError::TooLong {
            bytes: content.len(),
            max_bytes,
        });
    }
    let trimmed = content.trim();
    if let Ok(whole) = parse_lenient(trimmed) {
        return Ok(whole);
    }
    let candidate = fenced(trimmed).unwrap_or(trimmed);
    let candidate = match (candidate.find('{'), candidate.rfind('}')) {
        (Some(start), Some(end)) if start < end => &candidate[start..=end],
        _ => return Err(AnswerError::NoObject),
    };
    parse_lenient(candidate).map_err(AnswerError::Invalid)
}

/// Parses JSON that may hold raw control characters (a literal newline or tab) inside its
/// strings, which the grammar forbids but servers and small models write: if the text does
/// not parse as it is, it is parsed again with those characters escaped. A leading UTF-8
/// byte-order mark is skipped. The first error is the one returned.
pub fn parse_lenient<T: DeserializeOwned>(text: &str) -> Result<T, serde_json::Error> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    match serde_json::from_str(text) {
        Ok(value) => Ok(value),
        Err(first) => match escape_controls_in_strings(text) {
            Some(escaped) => serde_json::from_str(&escaped).map_err(|_| first),
            None => Err(first),
        },
    }
}

/// `text` with control characters inside JSON strings escaped; `None` if there are none.
fn escape_controls_in_strings(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len() + 16);
    let (mut in_string, mut escaped, mut changed) = (false, false, false);
    for c in text.chars() {
        if in_string {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            } else if (c as u32) < 0x20 {
                out.push_str(&format!("\\u{:04x}", c as u32));
                changed = true;
                continue;
            }
        } else if c == '"' {
            in_string = true;
        }
        out.push(c);
    }
    changed.then_some(out)
}

/// Why an LLM's answer gives no object of the expected shape. Its text is what the model is
/// told (the planners carry it as a string in their answers and journal it).
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    #[error("the answer is {bytes} bytes; at most {max_bytes} are accepted")]
    TooLong { bytes: usize, max_bytes: usize },
    #[error("the answer contains no JSON object")]
    NoObject,
    #[error("the answer is not valid: {0}")]
    Invalid(#[source] serde_json::Error),
}

fn fenced(text: &str) -> Option<&str> {
    let start = text.find("```")?;
    let after = &text[start + 3..];
    let body_start = after.find('\n')? + 1;
    let body = &after[body_start..];
    let end = body.find("```")?;
    Some(&body[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_of_the_schemas_shape_parses() {
        let schema = planner_answer_schema();
        let required = |v: &serde_json::Value| -> Vec<String> {
            serde_json::from_value(v["required"].clone()).unwrap()
        };
        assert_eq!(required(&schema), ["scratchpad", "tasks"]);
        let item = &schema["properties"]["tasks"]["items"];
        // Every property the schema names is a field PlannerOutput's tasks read.
        let answer = serde_json::json!({
            "scratchpad": "s",
            "tasks": [{
                "description": "d", "scope": ["a"], "acceptance": "x",
                "priority": 2, "dependencies": [0, "t1"]
            }]
        });
        for key in item["properties"].as_object().unwrap().keys() {
            assert!(answer["tasks"][0].get(key).is_some(), "{key}");
        }
        let parsed: PlannerOutput = parse_json_answer(&answer.to_string(), 10_000).unwrap();
        assert_eq!(parsed.tasks[0].acceptance, "x");
        assert_eq!(parsed.tasks[0].dependencies.len(), 2);
    }

    #[test]
    fn raw_control_characters_inside_strings_are_escaped_only_there() {
        let text = "{\"a\": \"line one\nline\ttwo\u{1}\",\n \"b\": \"ok\\\"\n\"}";
        let value: serde_json::Value = parse_lenient(text).unwrap();
        assert_eq!(value["a"], "line one\nline\ttwo\u{1}");
        assert_eq!(value["b"], "ok\"\n");
        assert!(parse_lenient::<serde_json::Value>("{\"a\": tru}").is_err());
        assert_eq!(escape_controls_in_strings("{\"a\":\n1}"), None);
    }

    /// A small model (SmolLM2, the first real-model evaluation) wrote raw newlines inside
    /// the scratchpad's string ten answers in a row: the answer is taken.
    #[test]
    fn a_planner_answer_with_a_raw_newline_inside_a_string_is_taken() {
        let answer =
            "```json\n{\"scratchpad\": \"Goal: calc\nNext: write it\", \"tasks\": []}\n```";
        let value: serde_json::Value = parse_json_answer(answer, 10_000).unwrap();
        assert_eq!(value["scratchpad"], "Goal: calc\nNext: write it");
    }

    #[test]
    fn accepts_plain_and_fenced_json() {
        let plain: PlannerOutput = parse_json_answer(r#"{"tasks": []}"#, 1000).unwrap();
        assert!(plain.tasks.is_empty());
        let fenced = "Here is the plan:\n```json\n{\"scratchpad\": \"s\", \"tasks\": [{\"description\": \"d\", \"scope\": [\"a\"]}]}\n```\n";
        let out: PlannerOutput = parse_json_answer(fenced, 1000).unwrap();
        assert_eq!(out.tasks[0].scope, vec!["a".to_string()]);
    }

    #[test]
    fn valid_json_whose_strings_mention_a_fence_is_taken_whole() {
        // Issue 11 (fuzzing): the fence was looked for first, so this pretty-printed answer
        // was cut between the two fences its descriptions mention, and refused.
        let answer = r#"{
  "tasks": [
    {"description": "show the example in a ```rust block", "scope": ["a.md"]},
    {"description": "close the block with ``` on its own line", "scope": ["b.md"]}
  ]
}"#;
        let out: PlannerOutput = parse_json_answer(answer, 10_000).unwrap();
        assert_eq!(out.tasks.len(), 2);
        assert_eq!(
            out.tasks[1].description,
            "close the block with ``` on its own line"
        );
    }

    #[test]
    fn refuses_malformed_and_oversize_answers_and_ignores_invented_ids() {
        assert!(
            parse_json_answer::<PlannerOutput>("I think we should", 1000)
                .unwrap_err()
                .to_string()
                .contains("no JSON object")
        );
        assert!(parse_json_answer::<PlannerOutput>("{\"tasks\": [", 1000).is_err());
        assert!(
            parse_json_answer::<PlannerOutput>(&"x".repeat(2000), 1000)
                .unwrap_err()
                .to_string()
                .contains("2000 bytes")
        );
        let ignored: PlannerOutput = parse_json_answer(
            r#"{"tasks": [{"id": "main", "description": "d", "scope": ["a"]}]}"#,
            1000,
        )
        .unwrap();
        assert_eq!(ignored.tasks[0].description, "d");
        let err = parse_json_answer::<PlannerOutput>(
            r#"{"tasks": [{"description": "d", "scope": ["a"], "priority": 0}]}"#,
            1000,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("priority"), "{err}");
    }
}
