//! Fix tasks worded by the `reconciler` role's model (ADR-032), with prompts/reconciler.md.
//!
//! flotilla finds, classifies, groups and scopes the failures itself (`crate::failures`);
//! the model only writes what each fix task's worker reads: a description and acceptance
//! criteria, one per fix, in order. Its answer is untrusted: bounded in size, parsed into
//! typed structs, stripped of control characters and cut to a bound. Any error (the model's,
//! an unusable answer, a wrong count, an empty description) is a typed [`WordingError`],
//! and the fixes keep flotilla's deterministic wording. Without a `reconciler` role in
//! `[roles]` no model is asked at all (and tests run on the deterministic wording).

use std::sync::Arc;

use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::llm::output::{AnswerError, parse_json_answer};
use crate::ports::{ChatMessage, Llm, LlmCall, LlmError, LlmRequest};
use crate::protocol::{FixWording, Role, SweepFix, Usage};

/// The largest answer read.
const MAX_ANSWER_BYTES: usize = 64 * 1024;
/// What one fix's words may hold at most, once cleaned.
const MAX_DESCRIPTION_BYTES: usize = 4 * 1024;
const MAX_ACCEPTANCE_BYTES: usize = 1024;
/// The most output tokens the call may produce.
const MAX_OUTPUT_TOKENS: u32 = 4_096;
/// What the model is shown of each fix's failure output.
const MAX_FACTS_BYTES: usize = 6 * 1024;

/// The `reconciler` role's model and its system prompt.
#[derive(Clone)]
pub struct FixWriter {
    pub llm: Arc<dyn Llm>,
    pub system: String,
}

/// Why the model's words were not used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WordingError {
    #[error("the reconciler's model failed: {0}")]
    Model(#[from] LlmError),
    #[error("the reconciler's answer is unusable: {0}")]
    Unusable(String),
    #[error("the reconciler's answer words {got} fix tasks; {expected} were asked for")]
    WrongCount { expected: usize, got: usize },
    #[error("the reconciler's answer leaves fix task {index}'s description empty")]
    EmptyDescription { index: usize },
}

impl From<AnswerError> for WordingError {
    fn from(e: AnswerError) -> Self {
        WordingError::Unusable(e.to_string())
    }
}

/// The answer's `scratchpad` (and anything else) is not read.
#[derive(Deserialize)]
struct Answer {
    tasks: Vec<Worded>,
}

/// Anything else a model adds (scope, priority, ids) is ignored: flotilla scopes fixes.
#[derive(Deserialize)]
struct Worded {
    #[serde(default)]
    description: String,
    #[serde(default)]
    acceptance: String,
}

/// The request's text: each fix as flotilla found it, numbered from 0.
pub fn request_text(commit: &str, fixes: &[SweepFix]) -> String {
    let mut text = format!(
        "A sweep of main at {commit} is red. flotilla grouped the failures into {} fix \
         task{}; word each one, in this order.\n",
        fixes.len(),
        if fixes.len() == 1 { "" } else { "s" }
    );
    for (i, fix) in fixes.iter().enumerate() {
        let files = if fix.scope.is_empty() {
            "(none named)".to_string()
        } else {
            fix.scope.join(", ")
        };
        text.push_str(&format!(
            "\n## Fix task {i}\nclass: {}\ntitle: {}\nfiles: {files}\nwhat failed:\n{}\n",
            fix.class,
            fix.title,
            cut(&fix.description, MAX_FACTS_BYTES)
        ));
    }
    text
}

/// The model's words for `expected` fixes, or why they cannot be used.
pub fn parse_answer(content: &str, expected: usize) -> Result<Vec<FixWording>, WordingError> {
    let answer: Answer = parse_json_answer(content, MAX_ANSWER_BYTES)?;
    if answer.tasks.len() != expected {
        return Err(WordingError::WrongCount {
            expected,
            got: answer.tasks.len(),
        });
    }
    answer
        .tasks
        .into_iter()
        .enumerate()
        .map(|(index, worded)| {
            let description = clean(&worded.description, MAX_DESCRIPTION_BYTES);
            if description.trim().is_empty() {
                return Err(WordingError::EmptyDescription { index });
            }
            Ok(FixWording {
                description,
                acceptance: clean(&worded.acceptance, MAX_ACCEPTANCE_BYTES),
            })
        })
        .collect()
}

impl FixWriter {
    /// Asks the model to word `fixes` (found at `commit`): its words, or why not, and what
    /// the call cost. Runs wherever its future is polled (the sweep's, off the actor).
    pub async fn word(
        &self,
        commit: &str,
        fixes: &[SweepFix],
        cancel: CancellationToken,
    ) -> (Result<Vec<FixWording>, WordingError>, Usage) {
        let messages = vec![
            ChatMessage::system(self.system.clone()),
            ChatMessage::user(request_text(commit, fixes)),
        ];
        let mut request = LlmRequest::chat(Role::Reconciler, messages).json();
        request.max_output_tokens = Some(MAX_OUTPUT_TOKENS);
        match self.llm.complete(request, LlmCall::new(cancel)).await {
            Ok(response) => (parse_answer(&response.content, fixes.len()), response.usage),
            Err(e) => (Err(WordingError::Model(e)), Usage::default()),
        }
    }
}

/// `text` without control characters (newlines and tabs kept), at most `max` bytes, cut
/// at a character boundary.
fn clean(text: &str, max: usize) -> String {
    let kept: String = text
        .trim()
        .chars()
        .filter(|c| !c.is_control() || *c == '\n' || *c == '\t')
        .collect();
    cut(&kept, max).to_string()
}

fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fix(title: &str) -> SweepFix {
        SweepFix {
            title: title.into(),
            description: "src/a.rs:3:5 E0412 cannot find type `Config`".into(),
            scope: vec!["src/a.rs".into()],
            signature: "sig".into(),
            class: "build".into(),
            worded: None,
        }
    }

    #[test]
    fn a_good_answer_gives_one_cleaned_wording_per_fix() {
        let answer = r#"{"scratchpad": "one class", "tasks": [
            {"description": "Rename\u001b[31m Config to Settings", "acceptance": "builds", "scope": ["/etc"]},
            {"description": "Fix the test", "priority": 1}
        ]}"#;
        let words = parse_answer(answer, 2).unwrap();
        assert_eq!(words[0].description, "Rename[31m Config to Settings");
        assert_eq!(words[0].acceptance, "builds");
        assert_eq!(words[1].acceptance, "");
    }

    #[test]
    fn garbage_is_a_typed_error() {
        assert!(matches!(
            parse_answer("I cannot help with that", 1),
            Err(WordingError::Unusable(_))
        ));
        assert_eq!(
            parse_answer(r#"{"tasks": []}"#, 1),
            Err(WordingError::WrongCount {
                expected: 1,
                got: 0
            })
        );
        assert_eq!(
            parse_answer(r#"{"tasks": [{"description": " \u0007 "}]}"#, 1),
            Err(WordingError::EmptyDescription { index: 0 })
        );
        let huge = format!(
            r#"{{"tasks": [{{"description": "{}"}}]}}"#,
            "x".repeat(MAX_ANSWER_BYTES)
        );
        assert!(matches!(
            parse_answer(&huge, 1),
            Err(WordingError::Unusable(_))
        ));
    }

    #[test]
    fn long_words_are_cut_at_a_character_boundary() {
        let long = "é".repeat(MAX_DESCRIPTION_BYTES);
        let answer = format!(r#"{{"tasks": [{{"description": "{long}"}}]}}"#);
        let words = parse_answer(&answer, 1).unwrap();
        assert!(words[0].description.len() <= MAX_DESCRIPTION_BYTES);
        assert!(words[0].description.chars().all(|c| c == 'é'));
    }

    #[test]
    fn the_request_numbers_each_fix_with_its_facts() {
        let text = request_text("abc1234", &[fix("main does not build"), fix("tests fail")]);
        assert!(text.contains("## Fix task 0\nclass: build\ntitle: main does not build"));
        assert!(text.contains("## Fix task 1"));
        assert!(text.contains("files: src/a.rs"));
        assert!(text.contains("E0412"));
    }
}
