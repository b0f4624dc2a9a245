//! The tool loop the Planner and the Subplanner share (ADR-037): one planning call that may
//! read the repository before it answers.
//!
//! The request offers the read-only tools ([`read_tools`](super::read_tools)); while the
//! model answers with tool calls, they are run against the commit pinned for the call,
//! each round is recorded (the actor journals it as `ToolsRan`), the results are appended
//! to the request, and the model is asked again. Bounds: at most `max_rounds` rounds, at
//! most [`MAX_CALLS_PER_ROUND`] calls a round (the rest dropped, and said), each result at most `max_result_bytes`, all
//! of a call's results at most `max_call_bytes`. When a bound is reached the model is told
//! so and asked for its answer without tools.
//!
//! The rounds live in a [`ToolSession`] that outlives one `ask`: a context-length refusal
//! that the actor answers by compacting its conversation, or a back-off after an error,
//! asks the same call again with the rounds already run, and a resumed run starts from the
//! rounds in the journal. A round is never run twice.
//!
//! The request stays within its byte limit with the tool results in it: the messages after
//! the conversation's own are bounded by [`compact_turns`] (old results summarized first),
//! and a context-length refusal halves that room before the actor's compaction is tried.

use std::sync::Arc;

use futures::future::BoxFuture;

use super::conversation::{BoundedConversation, BuiltRequest, compact_turns, excerpt};
use super::read_tools::{MAX_ARGUMENT_BYTES, ReadTools, specs, specs_bytes};
use crate::ports::{
    ChatMessage, Llm, LlmCall, LlmError, LlmRequest, LlmResponse, RepoReader, ToolCall,
};
use crate::protocol::{Role, TaskId, ToolRound, ToolRun, Usage};

/// Tool calls run in one round at most; more are dropped, and the model is told.
pub const MAX_CALLS_PER_ROUND: usize = 8;
/// What a request leaves for tool rounds at least, however full the conversation is.
pub const MIN_TOOL_ROOM: usize = 8 * 1024;
/// The longest tool-call id kept.
const MAX_ID_BYTES: usize = 256;
/// What is kept of the model's words beside its tool calls.
const ROUND_WORDS_BYTES: usize = 2 * 1024;
/// Tool results kept whole, the newest, when a request must shrink.
const KEEP_RECENT_RESULTS: usize = 2;
/// Context-length refusals answered by shrinking the tool rounds before the actor compacts.
const MAX_TOOL_SHRINKS: u32 = 3;

/// A role's tool bounds (`[planner]` / `[subplanner]` `max_tool_rounds`,
/// `max_tool_result_bytes`, `max_tool_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolLimits {
    /// 0: no tools are offered.
    pub max_rounds: u32,
    pub max_result_bytes: usize,
    pub max_call_bytes: usize,
}

impl ToolLimits {
    /// What a request built with tools leaves for them: the call's results and their
    /// framing, at most half the request.
    pub fn reserve(&self, limit: usize) -> usize {
        if self.max_rounds == 0 {
            return 0;
        }
        self.max_call_bytes
            .saturating_add(MIN_TOOL_ROOM)
            .saturating_add(specs_bytes())
            .min(limit / 2)
    }
}

/// The tool rounds of one planning call, and the commit they read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolSession {
    /// The call these rounds belong to.
    pub call: u32,
    /// main's tip, pinned when the call first asked; `None`: no tools this call.
    pub commit: Option<String>,
    pub rounds: Vec<ToolRound>,
    /// The provider refused a request that offered tools: the conversation goes on without
    /// them.
    pub refused: bool,
}

impl ToolSession {
    /// The rounds a journal holds for a call that was not answered yet.
    pub fn resumed(call: u32, rounds: Vec<ToolRound>) -> Self {
        ToolSession {
            call,
            commit: rounds.first().map(|r| r.commit.clone()),
            rounds,
            refused: false,
        }
    }

    /// Makes this the session of call `call`: kept if it is that call's already (rounds
    /// run or replayed), else started afresh, pinned at `tip` (an empty tip: a repository
    /// without commits, nothing to read).
    pub fn prepare(&mut self, call: u32, tip: Option<&str>) {
        if self.call == call && (self.commit.is_some() || !self.rounds.is_empty()) {
            return;
        }
        // A provider that refused tools once is not offered them again in this
        // conversation.
        *self = ToolSession {
            call,
            commit: tip.filter(|t| !t.is_empty()).map(str::to_string),
            rounds: Vec::new(),
            refused: self.refused,
        };
    }

    fn result_bytes(&self) -> usize {
        self.rounds
            .iter()
            .flat_map(|r| &r.runs)
            .map(|run| run.result.len())
            .sum()
    }

    /// What the rounds' model calls used: charged with the call's answer.
    pub fn usage(&self) -> Usage {
        self.rounds
            .iter()
            .fold(Usage::default(), |sum, r| add(sum, r.usage))
    }

    /// The rounds as messages: each the model's turn with its calls, then their results.
    fn messages(&self) -> Vec<ChatMessage> {
        let mut messages = Vec::new();
        for round in &self.rounds {
            let calls = round
                .runs
                .iter()
                .map(|run| ToolCall {
                    id: run.id.clone(),
                    name: run.name.clone(),
                    arguments: run.arguments.clone(),
                })
                .collect();
            messages.push(ChatMessage::assistant_calls(round.content.clone(), calls));
            for run in &round.runs {
                messages.push(ChatMessage::tool_result(run.id.clone(), run.result.clone()));
            }
        }
        messages
    }
}

fn add(a: Usage, b: Usage) -> Usage {
    Usage {
        tokens_in: a.tokens_in.saturating_add(b.tokens_in),
        tokens_out: a.tokens_out.saturating_add(b.tokens_out),
        cost_usd: a.cost_usd.saturating_add(b.cost_usd),
    }
}

/// A call's request from `conversation`: the one its first round sends (leaving room for
/// the tools' definitions), and the messages later rounds carry (leaving the reserve for
/// the rounds, [`ToolAsk::rounds_base`]). Without tools, the request alone, as before.
pub fn requests_for(
    conversation: &mut BoundedConversation,
    system: &str,
    prompt: &str,
    limits: ToolLimits,
    tools_on: bool,
) -> (BuiltRequest, Vec<ChatMessage>) {
    if !tools_on || limits.max_rounds == 0 {
        return (conversation.request(system, prompt), Vec::new());
    }
    let later = conversation
        .request_leaving(system, prompt, limits.reserve(conversation.limit()))
        .messages;
    // Built last: a context-length refusal halves from the size of what was sent first.
    let first = conversation.request_leaving(system, prompt, specs_bytes());
    (first, later)
}

/// Where each round goes as it is run (the actor journals it).
pub type RoundRecorder = Arc<dyn Fn(ToolRound) + Send + Sync>;

/// One planning call's setting: who asks, what may be read, within what.
#[derive(Clone)]
pub struct ToolAsk {
    pub llm: Arc<dyn Llm>,
    pub reader: Option<Arc<dyn RepoReader>>,
    pub limits: ToolLimits,
    /// Bytes the whole request may carry (the conversation's limit).
    pub request_limit: usize,
    pub record: RoundRecorder,
    pub role: Role,
    pub task: Option<TaskId>,
    pub attempt: u32,
    /// The conversation's messages built to leave [`ToolLimits::reserve`] free: what the
    /// requests after the first round carry instead of the request's own (which leaves
    /// only the tools' definitions free, so a call that reads nothing loses nothing).
    pub rounds_base: Vec<ChatMessage>,
}

/// Why no tools are offered any more, if that is so.
fn tools_closed(ask: &ToolAsk, session: &ToolSession) -> Option<String> {
    let rounds = u32::try_from(session.rounds.len()).unwrap_or(u32::MAX);
    if session.refused {
        Some("the provider refused a request that offered tools".into())
    } else if rounds >= ask.limits.max_rounds {
        Some(format!(
            "this call has used its {} tool rounds",
            ask.limits.max_rounds
        ))
    } else if session.result_bytes() >= ask.limits.max_call_bytes {
        Some(format!(
            "this call's tool results reached their bound of {} bytes",
            ask.limits.max_call_bytes
        ))
    } else {
        None
    }
}

impl ToolAsk {
    fn tools(&self, session: &ToolSession) -> Option<ReadTools> {
        let reader = self.reader.clone().filter(|_| self.limits.max_rounds > 0)?;
        let commit = session.commit.clone()?;
        Some(ReadTools::new(reader, commit, self.limits.max_result_bytes))
    }

    /// Asks `request` (the conversation's messages) as the session's call, running tool
    /// rounds until the model answers without tools; gives back the answer (its usage
    /// including the rounds') and the session.
    pub fn ask(
        self,
        request: LlmRequest,
        call: LlmCall,
        mut session: ToolSession,
    ) -> BoxFuture<'static, (Result<LlmResponse, LlmError>, ToolSession)> {
        Box::pin(async move {
            let mut shrinks = 0u32;
            loop {
                let base = match &self.rounds_base {
                    rounds_base if !session.rounds.is_empty() && !rounds_base.is_empty() => {
                        rounds_base
                    }
                    _ => &request.messages,
                };
                let fixed = base.len();
                let base_bytes: usize = base.iter().map(|m| m.content.len()).sum();
                // Each request is built afresh from the session: what it drops is counted
                // for it alone.
                let mut dropped = 0u32;
                let tools = self.tools(&session);
                let closed = tools.as_ref().and_then(|_| tools_closed(&self, &session));
                let offered = tools.is_some() && closed.is_none();
                // What the rounds may take: the rest of the limit (less the tools'
                // definitions when they are offered), halved by each refusal as too long.
                let definitions = if offered { specs_bytes() } else { 0 };
                let room = (self
                    .request_limit
                    .saturating_sub(base_bytes)
                    .saturating_sub(definitions)
                    >> shrinks)
                    .max(MIN_TOOL_ROOM / 2);
                let mut messages = base.clone();
                messages.extend(session.messages());
                if let Some(why) = closed.as_ref().filter(|_| !session.rounds.is_empty()) {
                    messages.push(ChatMessage::user(format!(
                        "[flotilla: no more tools in this call: {why}. Answer now with the JSON object \
                         the system prompt asks for.]"
                    )));
                }
                compact_turns(
                    &mut messages,
                    fixed,
                    base_bytes.saturating_add(room),
                    KEEP_RECENT_RESULTS,
                    &mut dropped,
                );
                let mut asked = request.clone();
                asked.messages = messages;
                if offered {
                    asked.tools = specs();
                }
                let round = u32::try_from(session.rounds.len()).unwrap_or(u32::MAX);
                let result = self.llm.complete(asked, call.clone().in_round(round)).await;
                let response = match result {
                    Ok(response) => response,
                    Err(error)
                        if error.is_context_too_long()
                            && !session.rounds.is_empty()
                            && shrinks < MAX_TOOL_SHRINKS =>
                    {
                        shrinks += 1;
                        continue;
                    }
                    Err(LlmError::Refused { .. }) if offered => {
                        session.refused = true;
                        continue;
                    }
                    Err(error) => return (Err(error), session),
                };
                let Some(tools) = tools.filter(|_| offered && !response.tool_calls.is_empty())
                else {
                    let mut response = response;
                    response.usage = add(session.usage(), response.usage);
                    return (Ok(response), session);
                };
                let runs = self.run_round(&tools, &session, &response).await;
                let recorded = ToolRound {
                    role: self.role,
                    task: self.task.clone(),
                    attempt: self.attempt,
                    call: session.call,
                    round,
                    commit: tools.commit().to_string(),
                    content: excerpt(&response.content, ROUND_WORDS_BYTES).into_owned(),
                    runs,
                    usage: response.usage,
                };
                (self.record)(recorded.clone());
                session.rounds.push(recorded);
            }
        })
    }

    /// Runs one round's calls in order, each result within what the call has left.
    async fn run_round(
        &self,
        tools: &ReadTools,
        session: &ToolSession,
        response: &LlmResponse,
    ) -> Vec<ToolRun> {
        let mut left = self
            .limits
            .max_call_bytes
            .saturating_sub(session.result_bytes());
        // Calls past the round's cap are dropped from the round (the model's turn as
        // replayed shows only those run), and the last result says so.
        let calls = &response.tool_calls;
        let mut runs = Vec::with_capacity(calls.len().min(MAX_CALLS_PER_ROUND));
        for call in calls.iter().take(MAX_CALLS_PER_ROUND) {
            let result = if left == 0 {
                "not run: this call's tool results reached their bound".to_string()
            } else {
                let text = tools.run(call).await;
                excerpt(&text, left).into_owned()
            };
            left = left.saturating_sub(result.len());
            let arguments = if call.arguments.len() > MAX_ARGUMENT_BYTES {
                format!(
                    "{{\"compacted\":\"{} bytes of arguments\"}}",
                    call.arguments.len()
                )
            } else {
                call.arguments.clone()
            };
            runs.push(ToolRun {
                // A provider's ids are short; a longer one is cut (the same way in the
                // assistant turn and its result, so they still pair).
                id: excerpt(&call.id, MAX_ID_BYTES).into_owned(),
                name: excerpt(&call.name, 100).into_owned(),
                arguments,
                result,
            });
        }
        let dropped = calls.len().saturating_sub(MAX_CALLS_PER_ROUND);
        if let Some(last) = runs.last_mut().filter(|_| dropped > 0) {
            last.result.push_str(&format!(
                "\n[flotilla: {dropped} more calls of this round were not run: at most \
                 {MAX_CALLS_PER_ROUND} a round]"
            ));
        }
        runs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(call: u32) -> ToolRound {
        ToolRound {
            role: Role::Planner,
            task: None,
            attempt: 0,
            call,
            round: 0,
            commit: "old".into(),
            content: String::new(),
            runs: vec![ToolRun {
                id: "a".into(),
                name: "read_file".into(),
                arguments: "{}".into(),
                result: "12345".into(),
            }],
            usage: Usage {
                tokens_in: 7,
                ..Usage::default()
            },
        }
    }

    #[test]
    fn a_session_is_kept_for_its_call_and_pinned_afresh_for_the_next() {
        let mut session = ToolSession::resumed(3, vec![round(3)]);
        session.prepare(3, Some("new"));
        assert_eq!(
            session.commit.as_deref(),
            Some("old"),
            "a resumed call keeps its pin"
        );
        assert_eq!((session.result_bytes(), session.usage().tokens_in), (5, 7));
        session.refused = true;
        session.prepare(4, Some("new"));
        assert_eq!(session.commit.as_deref(), Some("new"));
        assert!(session.rounds.is_empty() && session.refused);
        // A repository without commits: nothing to read.
        session.prepare(5, Some(""));
        assert_eq!(session.commit, None);
    }

    #[test]
    fn the_reserve_is_at_most_half_the_request_and_nothing_without_tools() {
        let limits = ToolLimits {
            max_rounds: 8,
            max_result_bytes: 16 * 1024,
            max_call_bytes: 64 * 1024,
        };
        assert_eq!(limits.reserve(1024 * 1024), 72 * 1024 + specs_bytes());
        assert_eq!(limits.reserve(32 * 1024), 16 * 1024);
        let off = ToolLimits {
            max_rounds: 0,
            ..limits
        };
        assert_eq!(off.reserve(1024 * 1024), 0);
    }
}
