//! The reviewer (ADR-038): a step of a Worker's attempt, run after git truth (`check.rs`)
//! found the delivered work clean and before the attempt reports success. Off unless
//! `[reviewer] enabled`; then the `reviewer` role's model reads the task (description,
//! acceptance, scope), the handoff's summary and what flotilla found, and the sealed diff
//! (bounded: when cut, the request says so and names the files left out), and answers
//! `{"verdict": "approve" | "changes_requested", "comments": [..]}`.
//!
//! Its answer is untrusted: parsed with the planners' lenient-but-typed parser, each comment
//! escaped and bounded ([`ReviewComments`]). An unusable answer is asked again with a
//! bounded excerpt and the reason, at most `max_calls` calls in all; then the review has no
//! verdict, and the attempt fails (`ReviewFailed`): unreviewed work never lands. Changes
//! requested fail the attempt (`ChangesRequested`): the retry is told the comments.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use actix::Recipient;

use crate::llm::output::parse_json_answer;
use crate::llm::read_tools::{ReadTools, specs};
use crate::llm::tool_loop::MAX_CALLS_PER_ROUND;
use crate::ports::{
    AgentReport, ChatMessage, DiffText, Llm, LlmCall, LlmError, LlmRequest, RepoReader, ToolSpec,
    TranscriptKind, TranscriptSink, Workspace, Worktrees,
};
use crate::protocol::{
    AttemptFailure, BranchWork, Budget, Handoff, HandoffStatus, ReviewComments, ReviewVerdict,
    Role, TaskId, TaskSpec, ToTaskGraph, Usage, retry::MAX_REVIEW_BYTES,
};

/// `[reviewer]` in flotilla.toml.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReviewerConfig {
    /// Off by default: no work is reviewed and no reviewer model is called.
    pub enabled: bool,
    /// The most bytes of the diff one request carries (whole files; the rest named).
    pub max_diff_bytes: usize,
    /// The most bytes of comments kept of a verdict (whole comments from the first).
    pub max_comment_bytes: usize,
    /// The most model calls one review makes (a first answer and re-asks after unusable
    /// ones or model errors).
    pub max_calls: u32,
    /// The largest answer read.
    pub max_answer_bytes: usize,
    /// The most output tokens a call may produce.
    pub max_output_tokens: u32,
    /// Rounds of read-only tools (ADR-037's, at the sealed branch's head) one review may
    /// run before it must answer; 0: no tools are offered.
    pub max_tool_rounds: u32,
    /// The most bytes of one tool's result.
    pub max_tool_result_bytes: usize,
}

impl Default for ReviewerConfig {
    fn default() -> Self {
        ReviewerConfig {
            enabled: false,
            max_diff_bytes: 64 * 1024,
            max_comment_bytes: MAX_REVIEW_BYTES,
            max_calls: 3,
            max_answer_bytes: 64 * 1024,
            max_output_tokens: 2_048,
            max_tool_rounds: 3,
            max_tool_result_bytes: 8 * 1024,
        }
    }
}

/// The bounds a `[reviewer]` table must keep.
pub const MAX_DIFF_BYTES: usize = 1024 * 1024;
pub const MAX_CALLS: u32 = 10;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReviewerConfigError {
    #[error("reviewer.max_diff_bytes must be from 1024 to {MAX_DIFF_BYTES}")]
    DiffBytes,
    #[error("reviewer.max_comment_bytes must be from 64 to {MAX_REVIEW_BYTES}")]
    CommentBytes,
    #[error("reviewer.max_calls must be from 1 to {MAX_CALLS}")]
    Calls,
    #[error("reviewer.max_answer_bytes must be from 256 to {MAX_DIFF_BYTES}")]
    AnswerBytes,
    #[error("reviewer.max_output_tokens must be at least 64")]
    OutputTokens,
    #[error("reviewer.max_tool_rounds must be at most {MAX_CALLS}")]
    ToolRounds,
    #[error("reviewer.max_tool_result_bytes must be from 1024 to 65536")]
    ToolResultBytes,
}

impl ReviewerConfig {
    pub fn validate(&self) -> Result<(), ReviewerConfigError> {
        if !(1024..=MAX_DIFF_BYTES).contains(&self.max_diff_bytes) {
            return Err(ReviewerConfigError::DiffBytes);
        }
        if !(64..=MAX_REVIEW_BYTES).contains(&self.max_comment_bytes) {
            return Err(ReviewerConfigError::CommentBytes);
        }
        if !(1..=MAX_CALLS).contains(&self.max_calls) {
            return Err(ReviewerConfigError::Calls);
        }
        if !(256..=MAX_DIFF_BYTES).contains(&self.max_answer_bytes) {
            return Err(ReviewerConfigError::AnswerBytes);
        }
        if self.max_output_tokens < 64 {
            return Err(ReviewerConfigError::OutputTokens);
        }
        if self.max_tool_rounds > MAX_CALLS {
            return Err(ReviewerConfigError::ToolRounds);
        }
        if !(1024..=64 * 1024).contains(&self.max_tool_result_bytes) {
            return Err(ReviewerConfigError::ToolResultBytes);
        }
        Ok(())
    }
}

/// A run's reviewer: the `reviewer` role's model, its system prompt, its bounds, and the
/// repository its read-only tools read (none: no tools).
#[derive(Clone)]
pub struct Reviewer {
    pub llm: Arc<dyn Llm>,
    pub system: String,
    pub config: ReviewerConfig,
    pub reader: Option<Arc<dyn RepoReader>>,
}

/// What one review reads.
pub struct ReviewInput<'a> {
    pub task: &'a TaskId,
    pub attempt: u32,
    pub spec: &'a TaskSpec,
    pub handoff: &'a Handoff,
    pub diff: &'a DiffText,
    /// The sealed branch's head commit: what the tools read (empty: no commit to read).
    pub head: &'a str,
}

/// What one review came to: the verdict, the calls it took and what they cost.
#[derive(Debug, Clone, PartialEq)]
pub struct ReviewOutcome {
    pub verdict: ReviewVerdict,
    pub calls: u32,
    pub usage: Usage,
}

/// The answer as the model writes it. Anything else it adds is ignored.
#[derive(Deserialize)]
struct Answer {
    verdict: Said,
    #[serde(default)]
    comments: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum Said {
    #[serde(alias = "approved")]
    Approve,
    #[serde(alias = "request_changes", alias = "changes-requested")]
    ChangesRequested,
}

/// The JSON Schema of the answer, for servers that can constrain their output to it.
pub fn answer_schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "verdict": { "type": "string", "enum": ["approve", "changes_requested"] },
            "comments": { "type": "array", "items": { "type": "string" } }
        },
        "required": ["verdict", "comments"]
    })
}

/// The verdict in `content`, or why it cannot be used (said to the model when it is asked
/// again).
pub fn parse_answer(content: &str, config: &ReviewerConfig) -> Result<ReviewVerdict, String> {
    let answer: Answer =
        parse_json_answer(content, config.max_answer_bytes).map_err(|e| e.to_string())?;
    let mut comments = ReviewComments::new(answer.comments.iter().map(String::as_str));
    comments.keep_bytes(config.max_comment_bytes);
    match answer.verdict {
        Said::Approve => Ok(ReviewVerdict::Approve { comments }),
        Said::ChangesRequested if comments.is_empty() => {
            Err("\"changes_requested\" needs at least one comment saying what to change".into())
        }
        Said::ChangesRequested => Ok(ReviewVerdict::ChangesRequested { comments }),
    }
}

/// The first `max` bytes of `text`, cut at a character boundary.
fn head(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    &text[..cut]
}

/// The most of the agent's and flotilla's words (summary, each concern, each finding) a
/// request carries.
const MAX_NOTE_BYTES: usize = 2 * 1024;
const MAX_NOTES: usize = 10;
/// What an unusable answer is shown back as, at most.
const MAX_EXCERPT_BYTES: usize = 1024;

/// The request: the task, the handoff, then the diff within `max_diff_bytes` (a cut says so
/// and names the files left out).
pub fn request_text(input: &ReviewInput<'_>, max_diff_bytes: usize) -> String {
    let spec = input.spec;
    let mut text = format!(
        "## Task {} (attempt {})\n{}\n\nscope: {}\nacceptance: {}\n",
        input.task,
        input.attempt,
        head(&spec.description, 8 * 1024),
        spec.scope.join(", "),
        if spec.acceptance.trim().is_empty() {
            "(none given: judge by the description)"
        } else {
            head(&spec.acceptance, 4 * 1024)
        }
    );
    let h = input.handoff;
    text.push_str(&format!(
        "\n## The worker's handoff ({:?})\n{}\n",
        h.status,
        head(&h.summary, MAX_NOTE_BYTES)
    ));
    for concern in h.concerns.iter().take(MAX_NOTES) {
        text.push_str(&format!("- concern: {}\n", head(concern, MAX_NOTE_BYTES)));
    }
    for finding in h.findings.iter().take(MAX_NOTES) {
        let finding = finding.to_string();
        text.push_str(&format!(
            "- flotilla found: {}\n",
            head(&finding, MAX_NOTE_BYTES)
        ));
    }
    let diff = input.diff;
    let shown = head(&diff.text, max_diff_bytes);
    let mut left_out: Vec<&str> = diff.left_out.iter().map(String::as_str).collect();
    let cut_here = shown.len() < diff.text.len();
    text.push_str("\n## The diff (main to the sealed branch)\n");
    if cut_here || !left_out.is_empty() {
        text.push_str(&format!(
            "The diff is cut to {} bytes: the files below are not shown{}.\n",
            max_diff_bytes,
            if cut_here {
                ", and the last file shown is cut short"
            } else {
                ""
            }
        ));
        let more = left_out.len().saturating_sub(100);
        left_out.truncate(100);
        for path in left_out {
            text.push_str(&format!("- not shown: {}\n", head(path, 256)));
        }
        if more > 0 {
            text.push_str(&format!("- and {more} more files not shown\n"));
        }
    }
    let longest_ticks = shown.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest_ticks.max(2) + 1);
    text.push_str(&format!("{fence}diff\n{shown}\n{fence}\n"));
    text
}

impl Reviewer {
    /// Reviews `input`, on whatever task polls the future (the Worker's attempt future,
    /// never the actor's own thread). Every path ends in a verdict: a model that keeps
    /// failing or answering unusably gives `ReviewVerdict::Failed` after `max_calls`.
    pub async fn review(&self, input: ReviewInput<'_>, cancel: CancellationToken) -> ReviewOutcome {
        let config = &self.config;
        let mut diff_bytes = config.max_diff_bytes;
        let mut messages = vec![
            ChatMessage::system(self.system.clone()),
            ChatMessage::user(request_text(&input, diff_bytes)),
        ];
        // The tools read the sealed branch's head: what would land, not main.
        let tools = match (&self.reader, config.max_tool_rounds) {
            (Some(reader), 1..) if !input.head.is_empty() => Some(ReadTools::new(
                reader.clone(),
                input.head.to_string(),
                config.max_tool_result_bytes,
            )),
            _ => None,
        };
        let mut usage = Usage::default();
        let mut last_problem = String::from("no call was made");
        // `requests`: every model call (the scripted provider's turn); `answers`: those
        // that had to give a verdict (bounded by `max_calls`); tool rounds have their own cap.
        let (mut requests, mut answers, mut rounds) = (0u32, 0u32, 0u32);
        while answers < config.max_calls {
            let offer = tools.is_some() && rounds < config.max_tool_rounds;
            let mut request =
                LlmRequest::chat(Role::Reviewer, messages.clone()).json_schema(answer_schema());
            if offer {
                request = request.with_tools(review_tool_specs());
            }
            request.max_output_tokens = Some(config.max_output_tokens);
            let call = LlmCall::new(cancel.clone())
                .for_task(input.task.clone())
                .for_attempt(input.attempt)
                .in_turn(requests);
            requests = requests.saturating_add(1);
            let result = self.llm.complete(request, call).await;
            match (result, &tools) {
                (Ok(response), Some(tools)) if offer && !response.tool_calls.is_empty() => {
                    usage = usage.saturating_add(&response.usage);
                    rounds = rounds.saturating_add(1);
                    run_round(tools, &response.content, response.tool_calls, &mut messages).await;
                    if rounds >= config.max_tool_rounds {
                        messages.push(ChatMessage::user(
                            "No more tool rounds: answer now with the JSON verdict.",
                        ));
                    }
                }
                (Ok(response), _) => {
                    answers = answers.saturating_add(1);
                    usage = usage.saturating_add(&response.usage);
                    match parse_answer(&response.content, config) {
                        Ok(verdict) => {
                            return ReviewOutcome {
                                verdict,
                                calls: requests,
                                usage,
                            };
                        }
                        Err(problem) => {
                            messages.push(ChatMessage::assistant(format!(
                                "[unusable answer, first {} of {} bytes] {}",
                                MAX_EXCERPT_BYTES.min(response.content.len()),
                                response.content.len(),
                                head(&response.content, MAX_EXCERPT_BYTES)
                            )));
                            messages.push(ChatMessage::user(format!(
                                "That answer cannot be used: {problem}. Answer again with only \
                                 the JSON object {{\"verdict\": \"approve\" | \
                                 \"changes_requested\", \"comments\": [..]}}."
                            )));
                            last_problem = problem;
                        }
                    }
                }
                (Err(LlmError::Cancelled), _) => {
                    last_problem = LlmError::Cancelled.to_string();
                    break;
                }
                (Err(LlmError::ContextTooLong { .. }), _) if diff_bytes > 1024 => {
                    // A smaller request may fit: the same one would be refused again. The
                    // tool rounds go too (their results are what grew it).
                    answers = answers.saturating_add(1);
                    diff_bytes /= 2;
                    messages.truncate(1);
                    messages.push(ChatMessage::user(request_text(&input, diff_bytes)));
                    rounds = config.max_tool_rounds;
                    last_problem = format!(
                        "the request was too long for the model's context even with {diff_bytes} bytes of diff"
                    );
                }
                (Err(e), _) => {
                    answers = answers.saturating_add(1);
                    last_problem = e.to_string();
                }
            }
        }
        ReviewOutcome {
            verdict: ReviewVerdict::failed(&format!(
                "no usable verdict in {answers} call(s): {last_problem}"
            )),
            calls: requests,
            usage,
        }
    }
}

/// The planners' read-only tools (ADR-037), described as what they read for a reviewer:
/// the worker's sealed branch.
fn review_tool_specs() -> Vec<ToolSpec> {
    specs()
        .into_iter()
        .map(|mut spec| {
            spec.description = spec
                .description
                .replace("main's tip", "the worker's sealed branch");
            spec
        })
        .collect()
}

/// One tool round: the model's turn (its words cut short) and every call's result, at most
/// [`MAX_CALLS_PER_ROUND`] run (the others answered "not run": each call needs a result).
async fn run_round(
    tools: &ReadTools,
    words: &str,
    calls: Vec<crate::ports::ToolCall>,
    messages: &mut Vec<ChatMessage>,
) {
    messages.push(ChatMessage::assistant_calls(
        head(words, MAX_EXCERPT_BYTES),
        calls.clone(),
    ));
    for (i, call) in calls.iter().enumerate() {
        let result = if i < MAX_CALLS_PER_ROUND {
            tools.run(call).await
        } else {
            format!("not run: at most {MAX_CALLS_PER_ROUND} tool calls a round")
        };
        messages.push(ChatMessage::tool_result(call.id.clone(), result));
    }
}

/// The handoff and branch of work a reviewer reads: delivered (complete or partial), with
/// changes, no subplan, and nothing git truth already fails (`failing`).
pub(super) fn reviewable(report: &AgentReport, failing: bool) -> Option<(&Handoff, &BranchWork)> {
    if failing || report.subplan.is_some() {
        return None;
    }
    let handoff = report.handoff.as_ref()?;
    if !matches!(
        handoff.status,
        HandoffStatus::Complete | HandoffStatus::Partial
    ) {
        return None;
    }
    let work = handoff.work.as_deref()?;
    (!work.files.is_empty() || work.files_omitted > 0).then_some((handoff, work))
}

/// The review step of one attempt, taken out of its Worker to run in the attempt's future
/// (after git truth, before the report; bounded by the attempt's wall time and token).
pub(super) struct ReviewStep {
    pub reviewer: Arc<Reviewer>,
    pub spec: Arc<TaskSpec>,
    pub worktrees: Arc<dyn Worktrees>,
    pub workspace: Workspace,
    pub graph: Recipient<ToTaskGraph>,
    pub task: TaskId,
    pub attempt: u32,
    pub cancel: CancellationToken,
    /// The attempt's transcript: the verdict is a note in it (`flotilla log`).
    pub transcript: TranscriptSink,
}

impl ReviewStep {
    /// Reads the diff, asks the reviewer, and tells the TaskGraph what it cost and said
    /// (before the attempt's own report, which follows on the same channel). `Ok`: approved.
    pub(super) async fn run(
        self,
        handoff: &Handoff,
        work: &BranchWork,
    ) -> Result<(), AttemptFailure> {
        let max_diff = self.reviewer.config.max_diff_bytes;
        let outcome = match self.worktrees.diff(&self.workspace, work, max_diff).await {
            Ok(diff) => {
                let input = ReviewInput {
                    task: &self.task,
                    attempt: self.attempt,
                    spec: &self.spec,
                    handoff,
                    diff: &diff,
                    head: &work.head,
                };
                self.reviewer.review(input, self.cancel.clone()).await
            }
            Err(e) => ReviewOutcome {
                verdict: ReviewVerdict::failed(&format!("reading the diff: {e}")),
                calls: 0,
                usage: Usage::default(),
            },
        };
        if self.cancel.is_cancelled() {
            // Called off or out of time: the attempt's end says so, not a verdict.
            return Err(AttemptFailure::Cancelled);
        }
        let mut note = format!(
            "review ({} call(s)): {}",
            outcome.calls,
            outcome.verdict.words()
        );
        match &outcome.verdict {
            ReviewVerdict::Failed { reason } => note.push_str(&format!(": {reason}")),
            verdict => {
                for comment in verdict.comments() {
                    note.push_str(&format!("\n- {comment}"));
                }
            }
        }
        self.transcript.record(TranscriptKind::Step, &note);
        let spent = outcome.usage.spent();
        if spent != Budget::default() {
            self.graph.do_send(ToTaskGraph::SpendReported {
                task: self.task.clone(),
                attempt: self.attempt,
                spent,
            });
        }
        self.graph.do_send(ToTaskGraph::Reviewed {
            task: self.task,
            attempt: self.attempt,
            review: outcome.verdict.clone(),
            calls: outcome.calls,
            usage: outcome.usage,
        });
        match outcome.verdict {
            ReviewVerdict::Approve { .. } => Ok(()),
            ReviewVerdict::ChangesRequested { comments } => Err(AttemptFailure::ChangesRequested {
                comments: comments.into(),
            }),
            ReviewVerdict::Failed { reason } => Err(AttemptFailure::ReviewFailed { reason }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ReviewerConfig {
        ReviewerConfig {
            enabled: true,
            ..ReviewerConfig::default()
        }
    }

    #[test]
    fn verdicts_parse_strictly_typed_and_leniently_wrapped() {
        let v = parse_answer(
            "```json\n{\"verdict\": \"changes_requested\", \"comments\": [\"add a test\"]}\n```",
            &config(),
        )
        .unwrap();
        assert_eq!(v.comments(), ["add a test"]);
        assert!(matches!(
            parse_answer(r#"{"verdict": "approve"}"#, &config()),
            Ok(ReviewVerdict::Approve { .. })
        ));
        assert!(parse_answer(r#"{"verdict": "maybe", "comments": []}"#, &config()).is_err());
        assert!(parse_answer("looks good to me", &config()).is_err());
        let empty = parse_answer(
            r#"{"verdict": "changes_requested", "comments": [" "]}"#,
            &config(),
        );
        assert!(empty.unwrap_err().contains("at least one comment"));
        let huge = format!(
            "{{\"verdict\": \"approve\", \"comments\": [\"{}\"]}}",
            "x".repeat(100_000)
        );
        assert!(
            parse_answer(&huge, &config())
                .unwrap_err()
                .contains("bytes")
        );
    }

    #[test]
    fn comments_are_kept_within_the_configured_bytes() {
        let config = ReviewerConfig {
            max_comment_bytes: 100,
            ..config()
        };
        let answer = serde_json::json!({
            "verdict": "changes_requested",
            "comments": ["a".repeat(60), "b".repeat(60), "\u{1b}[2Jc"],
        });
        let v = parse_answer(&answer.to_string(), &config).unwrap();
        assert_eq!(v.comments().len(), 1);
        assert!(v.comments().iter().map(String::len).sum::<usize>() <= 100);
    }

    #[test]
    fn a_cut_diff_is_said_and_the_files_left_out_are_named() {
        let spec = TaskSpec::new("write the parser", &["src"]);
        let diff = DiffText {
            text: "diff --git a/src/a.rs b/src/a.rs\n+fn a() {}\n".repeat(100),
            left_out: vec!["src/big.rs".into()],
        };
        let handoff = Handoff::complete("parser written");
        let input = ReviewInput {
            task: &TaskId::root(1),
            attempt: 2,
            spec: &spec,
            handoff: &handoff,
            diff: &diff,
            head: "",
        };
        let text = request_text(&input, 200);
        assert!(text.contains("## Task t1 (attempt 2)"));
        assert!(text.contains("parser written"));
        assert!(text.contains("The diff is cut to 200 bytes"));
        assert!(text.contains("- not shown: src/big.rs"));
        assert!(text.contains("the last file shown is cut short"));
        assert!(text.len() < 2_000, "{}", text.len());
        let whole = request_text(&input, 64 * 1024);
        assert!(!whole.contains("cut short"));
    }

    #[test]
    fn the_config_bounds_are_checked() {
        assert!(ReviewerConfig::default().validate().is_ok());
        let bad = |c: ReviewerConfig| c.validate().is_err();
        assert!(bad(ReviewerConfig {
            max_calls: 0,
            ..config()
        }));
        assert!(bad(ReviewerConfig {
            max_diff_bytes: 10,
            ..config()
        }));
        assert!(bad(ReviewerConfig {
            max_comment_bytes: MAX_REVIEW_BYTES + 1,
            ..config()
        }));
    }
}
