//! The Subplanner actor (ADR-008): one per run, one conversation per task it decomposes.
//!
//! Dispatch routes it the tasks too wide for one worker (`subplanner_scope_threshold` or
//! more scope paths, depth below `max_depth`). For each it runs the seed's loop:
//!
//! 1. The first call gets the parent task and the repository. Its answer goes to the
//!    TaskGraph as a `SubplannerAnswered`, which journals it (`SubplannerResponded`, its usage
//!    charged to the task once) and decides. No subtasks: the task is atomic and goes to a
//!    worker (`TaskAtomic`). Subtasks: they pass the same validation as any subplan and the
//!    parent waits for them, its decomposition open.
//! 2. After every subtask's handoff (`SubtaskEnded`) it calls again with what changed: the
//!    new handoffs, the subtasks still running, the repository's changes, and anything that
//!    was wrong with its last answer. Each answer is a further batch, or empty when the
//!    parent needs nothing more; the TaskGraph closes the decomposition on an empty answer
//!    once no subtask is running.
//! 3. When the decomposition is closed and every subtask has ended, the TaskGraph sends
//!    `SubtasksCompleted`; the Subplanner answers with the aggregate of the subtasks'
//!    handoffs (`subplanner_context::aggregate`), without a model call.
//!
//! Bounds: the TaskGraph closes the decomposition (or, before one, hands the task to a
//! worker) at `max_subplanner_iterations` calls; unusable answers and refused batches back
//! off exponentially, and after `max_consecutive_errors` in a row, or a model error that is
//! final, the Subplanner stops (`SubplannerStopped`) and the TaskGraph does the same. A
//! subtask wide enough goes to the Subplanner again: recursion is bounded by `max_depth`.
//!
//! After a restart the TaskGraph sends `Resume` for every open decomposition; the
//! conversation comes back from the journal (`resuming`), so nothing recorded is asked
//! again.
//!
//! Each conversation is bounded like the Planner's (ADR-030, [`BoundedConversation`]):
//! the first message, the carried scratchpad, the newest exchanges that fit the budget;
//! unusable answers and refused batches as excerpts; notes about one answer at most
//! [`context::MAX_NOTES`]; a context-length refusal compacts and asks again.

mod config;
pub mod context;
mod recorded;

pub use config::{SubplannerConfig, SubplannerConfigError};
pub use recorded::RecordedExchange;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::planner::Exchange;
use crate::actors::planner::context::RepoContext;
use crate::config::Limits;
use crate::llm::backoff;
use crate::llm::conversation::{BoundedConversation, excerpt};
use crate::llm::output::{PlannerOutput, parse_json_answer, planner_answer_schema};
use crate::llm::progress::with_progress_notices;
use crate::llm::tool_loop::{ToolAsk, ToolSession, requests_for};
use crate::ports::{
    FinishReason, Llm, LlmCall, LlmError, LlmRequest, LlmResponse, RepoError, RepoReader,
    RepoSnapshot, Role,
};
use crate::protocol::{
    Assignment, OpenDecomposition, Published, RunId, SubplannerAnswer, SubtaskResult,
    TaskCompleted, TaskId, TaskSpec, ToAgent, ToTaskGraph, ToolRound,
};
use crate::supervision::{Lifeline, StopCause, StopMember};
use context::{
    FollowUp, aggregate, follow_up_message, initial_message, proposals_from, push_notes,
};

/// What a call in flight asked: the prompt as built (asked again after a context-length
/// refusal), as sent, and the subtask results it reports.
struct Asked {
    prompt: String,
    sent: String,
    reported: Vec<TaskId>,
}

/// Where one conversation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for a subtask's handoff.
    Idle,
    /// A call (or the reads before it) is in flight.
    Asking,
    /// The TaskGraph is judging the last batch.
    AwaitingVerdict,
    /// After an error; a timer ends the wait.
    BackingOff,
    /// Planning is over for this task; only the aggregation is left.
    Done,
}

/// One task's conversation.
struct Conversation {
    attempt: u32,
    spec: Arc<TaskSpec>,
    history: BoundedConversation,
    repo_context: RepoContext,
    /// The task's first batch was accepted: later answers are further batches.
    decomposed: bool,
    /// Subtask results no prompt has carried yet.
    ended: Vec<SubtaskResult>,
    /// Subtasks still running, with their descriptions.
    active: BTreeMap<TaskId, String>,
    /// What the next prompt must say about the last answer.
    notes: Vec<String>,
    /// Descriptions of the batch being judged, in proposal order.
    judged: Vec<String>,
    /// What the call in flight carries: back into the next prompt if the call fails.
    in_flight: (Vec<SubtaskResult>, Vec<String>),
    phase: Phase,
    consecutive_errors: u32,
    cancel: CancellationToken,
    /// The read-only tool rounds of the call being asked (ADR-037).
    tools: ToolSession,
}

impl Conversation {
    fn new(
        attempt: u32,
        spec: Arc<TaskSpec>,
        cancel: CancellationToken,
        history: BoundedConversation,
    ) -> Self {
        Conversation {
            attempt,
            spec,
            history,
            repo_context: RepoContext::default(),
            decomposed: false,
            ended: Vec::new(),
            active: BTreeMap::new(),
            notes: Vec::new(),
            judged: Vec::new(),
            in_flight: (Vec::new(), Vec::new()),
            phase: Phase::Idle,
            consecutive_errors: 0,
            cancel,
            tools: ToolSession::default(),
        }
    }
}

pub struct Subplanner {
    run: RunId,
    system_prompt: String,
    llm: Arc<dyn Llm>,
    graph: Recipient<ToTaskGraph>,
    limits: Limits,
    config: SubplannerConfig,
    repo: Option<Arc<dyn RepoReader>>,
    notices: Option<Recipient<Published>>,
    conversations: HashMap<TaskId, Conversation>,
    /// Journaled exchanges, read when the TaskGraph says which decompositions are open.
    recorded: Vec<RecordedExchange>,
    /// Journaled tool rounds of calls not answered yet, replayed when their conversation
    /// resumes.
    recorded_tools: Vec<ToolRound>,
    /// Calls off every call in flight when the actor stops.
    cancel: CancellationToken,
    lifeline: Option<Lifeline>,
}

impl Subplanner {
    pub fn new(
        run: RunId,
        system_prompt: String,
        llm: Arc<dyn Llm>,
        graph: Recipient<ToTaskGraph>,
        limits: Limits,
        config: SubplannerConfig,
    ) -> Self {
        Subplanner {
            run,
            system_prompt,
            llm,
            graph,
            limits,
            config,
            repo: None,
            notices: None,
            conversations: HashMap::new(),
            recorded: Vec::new(),
            recorded_tools: Vec::new(),
            cancel: CancellationToken::new(),
            lifeline: None,
        }
    }

    /// Reads the target repository (main's tip) before every call.
    pub fn with_repo(mut self, repo: Arc<dyn RepoReader>) -> Self {
        self.repo = Some(repo);
        self
    }

    /// Sends live notices (a streaming call's progress) to `notices`.
    pub fn with_notices(mut self, notices: Recipient<Published>) -> Self {
        self.notices = Some(notices);
        self
    }

    /// The exchanges recorded in the journal, for the decompositions the TaskGraph resumes.
    pub fn resuming(mut self, recorded: Vec<RecordedExchange>) -> Self {
        self.recorded = recorded;
        self
    }

    /// The tool rounds the journal holds (ADR-037): those of a resumed conversation's
    /// unanswered call are replayed, never run again.
    pub fn resuming_tools(mut self, rounds: &[ToolRound]) -> Self {
        self.recorded_tools = rounds
            .iter()
            .filter(|r| r.role == Role::Subplanner)
            .cloned()
            .collect();
        self
    }

    /// Reports to the run's supervisor when the actor ends, however it ends.
    pub fn watched(mut self, lifeline: Lifeline) -> Self {
        self.lifeline = Some(lifeline);
        self
    }

    /// Tasks with a conversation: for tests and status.
    pub fn conversations(&self) -> usize {
        self.conversations.len()
    }

    fn assigned(&mut self, assignment: Assignment, ctx: &mut Context<Self>) {
        let task = assignment.task.task.clone();
        let attempt = assignment.task.attempt;
        if let Some(old) = self.conversations.remove(&task) {
            old.cancel.cancel();
        }
        let conversation = Conversation::new(
            attempt,
            assignment.task.spec.clone(),
            self.cancel.child_token(),
            self.history(Vec::new()),
        );
        self.conversations.insert(task.clone(), conversation);
        self.graph.do_send(ToTaskGraph::TaskStarted {
            task: task.clone(),
            attempt,
        });
        self.ask(task, ctx);
    }

    fn resumed(&mut self, open: OpenDecomposition, ctx: &mut Context<Self>) {
        let task = open.parent.clone();
        if let Some(old) = self.conversations.remove(&task) {
            old.cancel.cancel();
        }
        let recorded: Vec<Exchange> = self
            .recorded
            .iter()
            .filter(|r| r.task == task && r.attempt == open.attempt)
            .map(|r| r.exchange.clone())
            .collect();
        let mut conversation = Conversation::new(
            open.attempt,
            open.spec.clone(),
            self.cancel.child_token(),
            self.history(recorded),
        );
        let pending = conversation.history.calls();
        let rounds: Vec<ToolRound> = self
            .recorded_tools
            .iter()
            .filter(|r| r.of(Role::Subplanner, Some(&task), open.attempt) && r.call == pending)
            .cloned()
            .collect();
        if !rounds.is_empty() {
            conversation.tools = ToolSession::resumed(pending, rounds);
        }
        conversation.decomposed = true;
        conversation.active = open.active.into_iter().collect();
        conversation.ended = open.unheard;
        // With nothing running, only a call can move the decomposition on (its last answer
        // was refused or unusable, or its verdict was lost with the daemon).
        let ask = !conversation.ended.is_empty() || conversation.active.is_empty();
        self.conversations.insert(task.clone(), conversation);
        if ask {
            self.ask(task, ctx);
        }
    }

    /// A conversation's bounded history, continuing `recorded`.
    fn history(&self, recorded: Vec<Exchange>) -> BoundedConversation {
        BoundedConversation::resume(
            self.config.conversation().context_budget(),
            self.config.max_answer_bytes,
            recorded,
        )
    }

    /// Starts the next call about `task`: reads the repository (off this thread), then
    /// builds the prompt and asks.
    fn ask(&mut self, task: TaskId, ctx: &mut Context<Self>) {
        let cap = self.limits.max_subplanner_iterations;
        let Some(conv) = self.conversations.get_mut(&task) else {
            return;
        };
        if !matches!(conv.phase, Phase::Idle) {
            return;
        }
        if conv.history.calls() >= cap {
            // The TaskGraph closes at the cap when it records the last answer; this only
            // guards a resumed conversation.
            conv.phase = Phase::Done;
            let attempt = conv.attempt;
            self.graph.do_send(ToTaskGraph::SubplannerStopped {
                task,
                attempt,
                reason: format!("it reached its limit of {cap} calls"),
            });
            return;
        }
        conv.phase = Phase::Asking;
        let attempt = conv.attempt;
        let read = self.repo.as_ref().map(|repo| repo.snapshot());
        let read = async move {
            match read {
                Some(read) => Some(read.await),
                None => None,
            }
        };
        ctx.spawn(
            read.into_actor(self)
                .map(move |repo, act, ctx| act.call(task, attempt, repo, ctx)),
        );
    }

    fn call(
        &mut self,
        task: TaskId,
        attempt: u32,
        repo: Option<Result<RepoSnapshot, RepoError>>,
        ctx: &mut Context<Self>,
    ) {
        let Some(conv) = self
            .conversations
            .get_mut(&task)
            .filter(|c| c.attempt == attempt && c.phase == Phase::Asking)
        else {
            return;
        };
        let call = conv.history.calls();
        // Every tool round of this call reads the tip its prompt describes.
        let tip = repo.as_ref().and_then(|r| r.as_ref().ok());
        conv.tools
            .prepare(call, tip.map(|snapshot| snapshot.commit.as_str()));
        let mut reported = Vec::new();
        let prompt = if conv.history.is_empty() {
            let repo_text = repo
                .map(|r| conv.repo_context.initial(r))
                .unwrap_or_default();
            let mut msg = String::new();
            for note in &conv.notes {
                msg.push_str(&format!("## About your last answer\n{note}\n\n"));
            }
            conv.in_flight = (Vec::new(), std::mem::take(&mut conv.notes));
            msg.push_str(&initial_message(&task, &conv.spec, &repo_text));
            msg
        } else {
            let repo_text = repo
                .map(|r| conv.repo_context.follow_up(r))
                .unwrap_or_default();
            let ended: Vec<SubtaskResult> = std::mem::take(&mut conv.ended);
            let notes: Vec<String> = std::mem::take(&mut conv.notes);
            reported = ended.iter().map(|r| r.task.clone()).collect();
            let msg = follow_up_message(
                &repo_text,
                &FollowUp {
                    ended: &ended,
                    active: &conv.active,
                    notes: &notes,
                },
            );
            conv.in_flight = (ended, notes);
            msg
        };
        self.send(task, attempt, call, prompt, reported, ctx);
    }

    /// Asks the model `prompt` as call `call` about `task`, within the conversation's
    /// budget. Asked again, smaller, after a context-length refusal.
    fn send(
        &mut self,
        task: TaskId,
        attempt: u32,
        call: u32,
        prompt: String,
        reported: Vec<TaskId>,
        ctx: &mut Context<Self>,
    ) {
        let Some(conv) = self.conversations.get_mut(&task) else {
            return;
        };
        conv.phase = Phase::Asking;
        let limits = self.config.conversation().tool_limits();
        let tools_on = self.repo.is_some() && !conv.tools.refused;
        let (built, rounds_base) = requests_for(
            &mut conv.history,
            &self.system_prompt,
            &prompt,
            limits,
            tools_on,
        );
        let sent = built.prompt;
        let graph = self.graph.clone();
        let ask = ToolAsk {
            llm: self.llm.clone(),
            reader: self.repo.clone(),
            limits,
            request_limit: conv.history.limit(),
            record: Arc::new(move |round| graph.do_send(ToTaskGraph::ToolsRan(Box::new(round)))),
            role: Role::Subplanner,
            task: Some(task.clone()),
            attempt,
            rounds_base,
        };
        let llm_call = with_progress_notices(
            LlmCall::new(conv.cancel.child_token())
                .for_task(task.clone())
                .in_turn(call),
            self.notices.as_ref(),
            self.run,
            Role::Subplanner,
            Some(task.clone()),
        );
        let request = ask.ask(
            LlmRequest::chat(Role::Subplanner, built.messages).json_schema(planner_answer_schema()),
            llm_call,
            std::mem::take(&mut conv.tools),
        );
        ctx.spawn(
            request
                .into_actor(self)
                .map(move |(result, tools), act, ctx| {
                    if let Some(conv) = act
                        .conversations
                        .get_mut(&task)
                        .filter(|c| c.attempt == attempt)
                    {
                        conv.tools = tools;
                    }
                    act.answered(
                        task,
                        attempt,
                        call,
                        Asked {
                            prompt,
                            sent,
                            reported,
                        },
                        result,
                        ctx,
                    )
                }),
        );
    }

    fn answered(
        &mut self,
        task: TaskId,
        attempt: u32,
        call: u32,
        asked: Asked,
        result: Result<LlmResponse, LlmError>,
        ctx: &mut Context<Self>,
    ) {
        let Asked {
            prompt,
            sent,
            reported,
        } = asked;
        // Calls count from 0 here and from 1 in the log, as tail and status show them.
        let number = call.saturating_add(1);
        let max_bytes = self.config.max_answer_bytes;
        let max_path_bytes = self.limits.max_path_bytes;
        let Some(conv) = self
            .conversations
            .get_mut(&task)
            .filter(|c| c.attempt == attempt && c.phase == Phase::Asking)
        else {
            // Cancelled or superseded while the call ran: its answer is not used.
            return;
        };
        let response = match result {
            Ok(response) => response,
            // Too long for the model's context: asked again at once, with less.
            Err(error) if error.is_context_too_long() && conv.history.compact() => {
                info!(run = %self.run, %task, call = number, %error, "a Subplanner request was too long; compacting");
                self.send(task, attempt, call, prompt, reported, ctx);
                return;
            }
            Err(error) => {
                // What the prompt carried was not read: it goes into the next one.
                warn!(run = %self.run, %task, call = number, %error, "a Subplanner call failed");
                conv.phase = Phase::Idle;
                // Still too long at the smallest size: an error like an unusable answer.
                if !error.is_retryable() && !error.is_context_too_long() {
                    self.stop(&task, format!("its model cannot be used: {error}"));
                    return;
                }
                let delay = match error {
                    LlmError::RateLimited { retry_after_ms } => Some(retry_after_ms),
                    _ => None,
                };
                let (ended, notes) = std::mem::take(&mut conv.in_flight);
                conv.ended.splice(0..0, ended);
                conv.notes.splice(0..0, notes);
                self.back_off(task, error.to_string(), delay, ctx);
                return;
            }
        };
        conv.in_flight = (Vec::new(), Vec::new());
        let parsed = parse_json_answer::<PlannerOutput>(&response.content, max_bytes)
            .map_err(|error| match response.finish {
                FinishReason::Length => format!(
                    "the answer was cut off at the output-token limit ({error}); answer with fewer and shorter subtasks"
                ),
                _ => error.to_string(),
            });
        let subtasks = parsed.and_then(|out| {
            let proposed = out.tasks.len();
            let (proposals, notes) = proposals_from(out.tasks, &conv.spec.scope, max_path_bytes);
            let first_note = notes.first().map(|n| excerpt(n, 300).into_owned());
            let count = notes.len();
            push_notes(&mut conv.notes, notes);
            if proposed > 0 && proposals.is_empty() {
                // The notes themselves are in the next prompt: the reason only counts them.
                Err(format!(
                    "every proposed subtask was dropped ({count} notes; the first: {})",
                    first_note.unwrap_or_default()
                ))
            } else {
                Ok(proposals)
            }
        });
        let error = subtasks.as_ref().err().cloned();
        // What the conversation keeps is what the journal records: an answer that was not
        // used only as an excerpt.
        let exchange = Exchange::new(sent, response.content, error.clone());
        conv.history.record(exchange.clone());
        conv.tools.rounds.clear();
        let batch: Vec<String> = subtasks
            .as_ref()
            .map(|s| s.iter().map(|p| p.description.clone()).collect())
            .unwrap_or_default();
        self.graph.do_send(ToTaskGraph::SubplannerAnswered(Box::new(
            SubplannerAnswer {
                task: task.clone(),
                attempt,
                call,
                prompt: exchange.prompt,
                content: exchange.answer,
                usage: response.usage,
                reported,
                subtasks,
            },
        )));
        match error {
            Some(error) => {
                warn!(run = %self.run, %task, call = number, %error, "the Subplanner's answer was unusable");
                conv.phase = Phase::Idle;
                push_notes(&mut conv.notes, [format!("It could not be used: {error}")]);
                self.back_off(task, error, None, ctx);
            }
            None if batch.is_empty() && !conv.decomposed => {
                // Atomic: the TaskGraph hands the task to a worker (and calls this
                // conversation off).
                debug!(run = %self.run, %task, "the Subplanner found the task atomic");
                conv.phase = Phase::Done;
            }
            None if batch.is_empty() => {
                // Nothing more for now. The TaskGraph closes the decomposition if nothing is
                // running; otherwise the next handoff starts the next call.
                conv.phase = Phase::Idle;
                conv.consecutive_errors = 0;
                if !conv.ended.is_empty() {
                    self.ask(task, ctx);
                }
            }
            None => {
                conv.judged = batch;
                conv.phase = Phase::AwaitingVerdict;
            }
        }
    }

    fn back_off(
        &mut self,
        task: TaskId,
        error: String,
        at_least_ms: Option<u64>,
        ctx: &mut Context<Self>,
    ) {
        let Some(conv) = self.conversations.get_mut(&task) else {
            return;
        };
        conv.consecutive_errors = conv.consecutive_errors.saturating_add(1);
        if conv.consecutive_errors >= self.config.max_consecutive_errors {
            let errors = conv.consecutive_errors;
            self.stop(
                &task,
                format!("{errors} errors in a row; the last: {error}"),
            );
            return;
        }
        let delay = backoff::delay_ms(
            self.config.backoff_base_ms,
            self.config.backoff_max_ms,
            conv.consecutive_errors,
            at_least_ms,
        );
        conv.phase = Phase::BackingOff;
        let attempt = conv.attempt;
        ctx.run_later(Duration::from_millis(delay), move |act, ctx| {
            let due = act
                .conversations
                .get_mut(&task)
                .filter(|c| c.attempt == attempt && c.phase == Phase::BackingOff);
            if let Some(conv) = due {
                conv.phase = Phase::Idle;
                act.ask(task, ctx);
            }
        });
    }

    /// Gives up planning `task`: the TaskGraph hands it to a worker, or closes its
    /// decomposition. The conversation stays for the aggregation.
    fn stop(&mut self, task: &TaskId, reason: String) {
        let Some(conv) = self.conversations.get_mut(task) else {
            return;
        };
        info!(run = %self.run, %task, %reason, "the Subplanner stops planning the task");
        conv.phase = Phase::Done;
        self.graph.do_send(ToTaskGraph::SubplannerStopped {
            task: task.clone(),
            attempt: conv.attempt,
            reason,
        });
    }
}

impl Actor for Subplanner {
    type Context = Context<Self>;

    fn stopped(&mut self, _: &mut Context<Self>) {
        self.cancel.cancel();
    }
}

impl Handler<ToAgent> for Subplanner {
    type Result = ();

    fn handle(&mut self, msg: ToAgent, ctx: &mut Context<Self>) {
        match msg {
            ToAgent::Assign(assignment) => self.assigned(assignment, ctx),
            ToAgent::Resume(open) => self.resumed(open, ctx),
            ToAgent::DecompositionAccepted(accepted) => {
                let Some(conv) = self.conversations.get_mut(&accepted.parent) else {
                    return;
                };
                let judged = std::mem::take(&mut conv.judged);
                for (i, id) in accepted.subtasks.into_iter().enumerate() {
                    let description = judged.get(i).cloned().unwrap_or_default();
                    conv.active.insert(id, description);
                }
                conv.decomposed = true;
                conv.consecutive_errors = 0;
                if conv.phase == Phase::AwaitingVerdict {
                    conv.phase = Phase::Idle;
                }
                if !conv.ended.is_empty() {
                    self.ask(accepted.parent, ctx);
                }
            }
            ToAgent::DecompositionRejected(rejected) => {
                let Some(conv) = self.conversations.get_mut(&rejected.parent) else {
                    return;
                };
                conv.judged.clear();
                let error = format!("the batch was refused: {}", rejected.reason);
                conv.history.mark_last_unused(error.clone());
                push_notes(
                    &mut conv.notes,
                    [format!(
                        "Your batch was refused: {}. Nothing from it was added.",
                        rejected.reason
                    )],
                );
                if conv.phase == Phase::AwaitingVerdict {
                    conv.phase = Phase::Idle;
                    self.back_off(rejected.parent, error, None, ctx);
                }
            }
            ToAgent::SubtaskEnded(ended) => {
                let Some(conv) = self
                    .conversations
                    .get_mut(&ended.parent)
                    .filter(|c| c.attempt == ended.attempt)
                else {
                    return;
                };
                conv.active.remove(&ended.result.task);
                conv.ended.push(ended.result);
                if conv.phase == Phase::Idle {
                    self.ask(ended.parent, ctx);
                }
            }
            ToAgent::DecompositionClosed { parent, reason } => {
                if let Some(conv) = self.conversations.get_mut(&parent) {
                    debug!(run = %self.run, task = %parent, %reason, "decomposition closed");
                    conv.phase = Phase::Done;
                    conv.cancel.cancel();
                }
            }
            ToAgent::SubtasksCompleted(done) => {
                let conv = self.conversations.remove(&done.parent);
                if let Some(conv) = &conv {
                    conv.cancel.cancel();
                }
                let description = conv
                    .map(|c| c.spec.description.clone())
                    .unwrap_or_else(|| format!("task {}", done.parent));
                let handoff = aggregate(&description, &done.results);
                self.graph
                    .do_send(ToTaskGraph::TaskCompleted(Box::new(TaskCompleted {
                        task: done.parent,
                        attempt: done.attempt,
                        handoff: Some(handoff),
                        artifacts: Vec::new(),
                        subplan: None,
                    })));
            }
            ToAgent::Cancel { task, reason } => {
                if let Some(conv) = self.conversations.remove(&task) {
                    debug!(run = %self.run, %task, %reason, "Subplanner conversation called off");
                    conv.cancel.cancel();
                }
            }
        }
    }
}

impl Handler<StopMember> for Subplanner {
    type Result = ();

    fn handle(&mut self, _: StopMember, ctx: &mut Context<Self>) {
        if let Some(lifeline) = &mut self.lifeline {
            lifeline.set_cause(StopCause::Finished);
        }
        ctx.stop();
    }
}
