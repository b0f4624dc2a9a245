//! The Planner actor: the root planner's LLM conversation, run in sprints.
//!
//! It plans the first sprint on `Start`, then again when the graph is quiescent (nothing
//! live), or when at least `min_handoffs_for_replan` root handoffs are unread *and* either a
//! worker slot is free or one of those handoffs needs attention. Every answer goes to the
//! TaskGraph, which journals it (`PlannerResponded`) before submitting its tasks; an empty
//! answer while nothing is live ends planning.
//!
//! Capacity: Dispatch reports the number of free worker slots whenever it changes
//! (`Capacity`, forwarded by the TaskGraph). While every slot is busy, new tasks would only
//! wait in the queue, and a call spent now is one fewer for later (`max_iterations`): the
//! planner reads handoffs but waits for a free slot, as the seed's `hasCapacity` does. A
//! handoff needs attention, and is planned for at once, when its task did not complete or
//! its status is partial, blocked or failed: follow-up work should enter the queue before
//! more of the same. Concerns alone do not: workers attach them routinely, and the next
//! sprint's prompt carries them anyway. Until Dispatch has said anything, slots count as
//! free.
//!
//! A call counts as an error when the LLM call fails, when its answer cannot be parsed, and
//! when the TaskGraph refuses its batch (`BatchRejected`): each such error backs off
//! exponentially (a `Retry` timer) and the next prompt says what went wrong. A batch the
//! graph accepted (`BatchAccepted`), or a valid empty answer, ends the streak. After
//! `max_consecutive_errors` in a row the planner gives up (`PlannerGaveUp`: the run fails).
//! Reaching `max_iterations` calls is not a failure: the next time the planner would plan,
//! it finishes planning instead (`PlanningFinished`, the reason logged), and the run ends
//! when the tasks already planned have ended.
//!
//! An empty first sprint (no task planned yet) is asked once more, at once, with a reminder
//! that nothing has been planned: plan the first sprint, or confirm that nothing is needed.
//! The empty answer is recorded as not used (so the graph does not end planning on it); a
//! second empty answer is taken at its word.
//!
//! Nothing polls: every step is a message or a timer.
//!
//! The conversation is bounded (ADR-030, [`BoundedConversation`]): each request carries the
//! first message, the scratchpad of the latest used answer (read back from the journaled
//! answers after a restart), the newest exchanges that fit `max_context_bytes` and
//! `max_context_tokens`, and the new prompt. Unusable answers and refused batches are kept
//! as excerpts with their reason. A context-length refusal compacts the conversation and
//! asks again at once (not an error, at most `MAX_COMPACTIONS` times in the conversation's
//! life); past that it is an error like any other.
//!
//! Before each call it reads main's tip (`RepoReader::snapshot`): the first prompt carries
//! SPEC.md, FEATURES.json, AGENTS.md, DECISIONS.md, the file tree and the last 40 commits;
//! follow-ups only files added and removed and the documents whose text changed (after a
//! restart the tree is sent whole once), plus, from `GetSnapshot`, the active tasks and the
//! paths running tasks hold.

mod config;
pub mod context;

pub use crate::llm::conversation::Exchange;
pub use config::{MIN_ANSWER_BYTES, PlannerConfig, PlannerConfigError};

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::llm::backoff;
use crate::llm::conversation::BoundedConversation;
use crate::llm::output::{PlannerOutput, parse_json_answer, planner_answer_schema};
use crate::llm::progress::with_progress_notices;
use crate::llm::tool_loop::{ToolAsk, ToolSession, requests_for};
use crate::ports::{
    FinishReason, Llm, LlmCall, LlmError, LlmRequest, LlmResponse, RepoError, RepoReader,
    RepoSnapshot, Role,
};
use crate::protocol::{
    GetSnapshot, GraphSnapshot, HandoffStatus, MergeHealth, PlannerAnswer, Published,
    RejectionReason, RootHandoff, RunId, TaskState, TaskView, ToPlanner, ToTaskGraph, ToolRound,
};
use crate::supervision::{Lifeline, StopCause, StopMember};
use context::RepoContext;

/// Where the planner is in its cycle of asking, being judged and waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for a reason to plan (handoffs, quiescence).
    Idle,
    /// An LLM call is in flight.
    Asking,
    /// The TaskGraph is validating the last batch; its verdict decides whether that call was
    /// an error. No new call starts before it, so a refusal is explained in the very next
    /// prompt and counted before anything else happens.
    AwaitingVerdict,
    /// After an error: the `Retry` timer ends the wait. Triggers meanwhile are not lost:
    /// the retry's prompt carries every unread handoff.
    BackingOff,
    /// Planning finished or the planner gave up; it asks nothing more.
    Done,
}

pub struct Planner {
    run: RunId,
    request: String,
    system_prompt: String,
    llm: Arc<dyn Llm>,
    graph: Recipient<ToTaskGraph>,
    config: PlannerConfig,
    /// The conversation, bounded; rebuilt from the journal after a restart.
    conversation: BoundedConversation,
    unread: Vec<RootHandoff>,
    rejections: Vec<RejectionReason>,
    /// The last answer was unusable; say why in the next prompt.
    last_error: Option<String>,
    phase: Phase,
    /// Calls in a row that failed, were unusable or were refused.
    consecutive_errors: u32,
    /// Free worker slots as Dispatch last reported them; `None` until it reports.
    free_workers: Option<usize>,
    /// The merge queue's health since the last prompt (M6), for the next follow-up.
    merge_health: Option<MergeHealth>,
    /// Some answer so far had tasks in it.
    planned_anything: bool,
    /// The empty-first-sprint reminder was sent (it is sent at most once per run).
    reminded: bool,
    /// The next prompt carries that reminder.
    remind_empty: bool,
    /// Reports to the run's supervisor when the actor ends.
    lifeline: Option<Lifeline>,
    /// Calls off an LLM call in flight when the actor stops.
    cancel: CancellationToken,
    /// The target repository, read (main's tip) before every call.
    repo: Option<Arc<dyn RepoReader>>,
    /// Where live notices go (a streaming call's progress): the run's supervisor.
    notices: Option<Recipient<Published>>,
    /// The run's graph, read before each follow-up for the active tasks and locked scopes.
    graph_view: Option<Recipient<GetSnapshot>>,
    /// What the prompts told the model about the repository, so that follow-ups send only
    /// what changed.
    repo_context: RepoContext,
    /// The read-only tool rounds of the call being asked (ADR-037), kept across its
    /// retries; journaled rounds after a restart.
    tools: ToolSession,
}

/// Why an empty first answer was not taken as "nothing to do" (recorded in the journal).
const EMPTY_FIRST_SPRINT: &str =
    "the first sprint was an empty task list; asking once more before planning ends";

/// The reminder's header (its text follows): also how a resumed planner knows it was
/// already sent.
const REMINDER_HEADER: &str = "## Your previous answer was an empty task list";

const EMPTY_SPRINT_REMINDER: &str = "Nothing has been planned for this request yet. If it needs any work, plan the first \
    sprint now: only tasks you can fully specify. If nothing at all is needed, answer with \
    an empty task list again to confirm; planning then ends.\n\n";

impl Planner {
    pub fn new(
        run: RunId,
        request: String,
        system_prompt: String,
        llm: Arc<dyn Llm>,
        graph: Recipient<ToTaskGraph>,
        config: PlannerConfig,
    ) -> Self {
        let conversation = BoundedConversation::new(
            config.conversation().context_budget(),
            config.max_answer_bytes,
        );
        Planner {
            run,
            request,
            system_prompt,
            llm,
            graph,
            config,
            conversation,
            unread: Vec::new(),
            rejections: Vec::new(),
            last_error: None,
            phase: Phase::Idle,
            consecutive_errors: 0,
            free_workers: None,
            merge_health: None,
            planned_anything: false,
            reminded: false,
            remind_empty: false,
            lifeline: None,
            cancel: CancellationToken::new(),
            repo: None,
            notices: None,
            graph_view: None,
            repo_context: RepoContext::default(),
            tools: ToolSession::default(),
        }
    }

    /// Reads the target repository (main's tip) before every call: the first prompt carries
    /// its planning documents, file tree and recent commits, later ones what changed.
    pub fn with_repo(mut self, repo: Arc<dyn RepoReader>) -> Self {
        self.repo = Some(repo);
        self
    }

    /// Reads the run's graph before each follow-up, to tell the model which tasks are still
    /// active and which paths running tasks hold.
    pub fn with_graph_view(mut self, view: Recipient<GetSnapshot>) -> Self {
        self.graph_view = Some(view);
        self
    }

    /// Sends live notices (a streaming call's progress) to `notices`.
    pub fn with_notices(mut self, notices: Recipient<Published>) -> Self {
        self.notices = Some(notices);
        self
    }

    /// Reports to the run's supervisor when the actor ends, however it ends.
    pub fn watched(mut self, lifeline: Lifeline) -> Self {
        self.lifeline = Some(lifeline);
        self
    }

    /// Continues a conversation recorded in the journal. What the planner remembers about
    /// the empty-first-sprint reminder is read back from it.
    pub fn resuming(mut self, conversation: Vec<Exchange>) -> Self {
        let max_bytes = self.config.max_answer_bytes;
        let tasks_in = |answer: &str| {
            parse_json_answer::<PlannerOutput>(answer, max_bytes).map(|out| out.tasks.len())
        };
        self.planned_anything = conversation
            .iter()
            .any(|ex| tasks_in(&ex.answer).is_ok_and(|n| n > 0));
        self.reminded = conversation
            .iter()
            .any(|ex| ex.prompt.contains(REMINDER_HEADER));
        // Stopped between an empty first sprint and the reminder: the reminder is still due.
        self.remind_empty = conversation
            .last()
            .is_some_and(|ex| matches!(tasks_in(&ex.answer), Ok(0)))
            && self.reminder_due();
        self.conversation = BoundedConversation::resume(
            self.config.conversation().context_budget(),
            self.config.max_answer_bytes,
            conversation,
        );
        self
    }

    /// The tool rounds the journal holds for the call that was not answered (after
    /// [`resuming`](Self::resuming)): replayed, never run again.
    pub fn resuming_tools(mut self, rounds: &[ToolRound]) -> Self {
        let call = self.conversation.calls();
        let rounds: Vec<ToolRound> = rounds
            .iter()
            .filter(|r| r.of(Role::Planner, None, 0) && r.call == call)
            .cloned()
            .collect();
        if !rounds.is_empty() {
            self.tools = ToolSession::resumed(call, rounds);
        }
        self
    }

    /// An empty answer now would be the run's first plan: it earns one reminder.
    fn reminder_due(&self) -> bool {
        !self.planned_anything && !self.reminded
    }

    fn prompt(
        &mut self,
        repo: Option<Result<RepoSnapshot, RepoError>>,
        graph: Option<GraphSnapshot>,
    ) -> String {
        let mut msg = String::new();
        if self.conversation.is_empty() {
            msg.push_str(&format!("## Request\n{}\n\n", self.request));
            if let Some(repo) = repo {
                msg.push_str(&self.repo_context.initial(repo));
            }
            msg.push_str(
                "This is the first planning call. Plan the first sprint: only tasks you can fully specify now.\n",
            );
            return msg;
        }
        if let Some(repo) = repo {
            msg.push_str(&self.repo_context.follow_up(repo));
        }
        if let Some(graph) = graph {
            msg.push_str(&active_work(&graph));
        }
        if let Some(health) = self.merge_health.take() {
            msg.push_str(&format!(
                "## Merge queue
{} waiting to land; {} landed, {} failed ({}% landed); median wait {} s

",
                health.queued,
                health.landed,
                health.failed,
                health.success_percent(),
                health.median_wait_ms / 1000
            ));
        }
        if std::mem::take(&mut self.remind_empty) {
            self.reminded = true;
            msg.push_str(&format!("{REMINDER_HEADER}\n{EMPTY_SPRINT_REMINDER}"));
        }
        if let Some(error) = self.last_error.take() {
            msg.push_str(&format!(
                "## Your last answer could not be used\n{error}\n\n"
            ));
        }
        for reason in self.rejections.drain(..) {
            msg.push_str(&format!(
                "## Your last batch was refused\n{reason}\nNothing from it was added.\n\n"
            ));
        }
        if !self.unread.is_empty() {
            msg.push_str("## Handoffs since your last plan\n");
            for h in self.unread.drain(..) {
                msg.push_str(&format!(
                    "### {} ({}): {}\n",
                    h.task, h.state, h.description
                ));
                if let Some(failure) = &h.failure {
                    msg.push_str(&format!("why: {failure}\n"));
                }
                if let Some(handoff) = &h.handoff {
                    let summary: String = handoff
                        .summary
                        .chars()
                        .take(self.config.max_summary_chars)
                        .collect();
                    msg.push_str(&format!(
                        "status: {:?}\nsummary: {summary}\n",
                        handoff.status
                    ));
                    let files: Vec<&str> = handoff
                        .files_changed
                        .iter()
                        .take(10)
                        .map(String::as_str)
                        .collect();
                    if !files.is_empty() {
                        msg.push_str(&format!("files changed: {}\n", files.join(", ")));
                    }
                    for c in &handoff.concerns {
                        msg.push_str(&format!("concern: {c}\n"));
                    }
                    for f in &handoff.findings {
                        msg.push_str(&format!("flotilla found: {f}\n"));
                    }
                    for s in &handoff.suggestions {
                        msg.push_str(&format!("suggestion: {s}\n"));
                    }
                }
                msg.push('\n');
            }
        }
        msg.push_str("Plan the next sprint, or answer with an empty task list if the request is fully done.\n");
        msg
    }

    fn plan(&mut self, ctx: &mut Context<Self>) {
        if self.phase != Phase::Idle {
            return;
        }
        let call = self.conversation.calls();
        if call >= self.config.max_iterations {
            self.finish(format!(
                "the planner reached its limit of {} calls; the tasks already planned run to the end",
                self.config.max_iterations
            ));
            return;
        }
        self.phase = Phase::Asking;
        // The repository and the graph are read first (off this thread), then the prompt is
        // built. The first prompt needs no graph: nothing is planned yet.
        let repo = self.repo.as_ref().map(|repo| repo.snapshot());
        let view = self
            .graph_view
            .as_ref()
            .filter(|_| call > 0)
            .map(|view| view.send(GetSnapshot));
        let read = async move {
            let repo = match repo {
                Some(read) => Some(read.await),
                None => None,
            };
            let graph = match view {
                Some(asked) => asked.await.ok(),
                None => None,
            };
            (repo, graph)
        };
        ctx.spawn(
            read.into_actor(self)
                .map(move |(repo, graph), act, ctx| act.ask(call, repo, graph, ctx)),
        );
    }

    fn ask(
        &mut self,
        call: u32,
        repo: Option<Result<RepoSnapshot, RepoError>>,
        graph: Option<GraphSnapshot>,
        ctx: &mut Context<Self>,
    ) {
        // Every tool round of this call reads the tip this prompt describes.
        let tip = repo.as_ref().and_then(|r| r.as_ref().ok());
        self.tools
            .prepare(call, tip.map(|snapshot| snapshot.commit.as_str()));
        let prompt = self.prompt(repo, graph);
        self.send(call, prompt, ctx);
    }

    /// Asks the model `prompt` as call `call`, within the conversation's budget. Asked
    /// again, smaller, after a context-length refusal.
    fn send(&mut self, call: u32, prompt: String, ctx: &mut Context<Self>) {
        self.phase = Phase::Asking;
        let limits = self.config.conversation().tool_limits();
        let tools_on = self.repo.is_some() && !self.tools.refused;
        let (built, rounds_base) = requests_for(
            &mut self.conversation,
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
            request_limit: self.conversation.limit(),
            record: Arc::new(move |round| graph.do_send(ToTaskGraph::ToolsRan(Box::new(round)))),
            role: Role::Planner,
            task: None,
            attempt: 0,
            rounds_base,
        };
        let request = ask.ask(
            LlmRequest::chat(Role::Planner, built.messages).json_schema(planner_answer_schema()),
            self.call().in_turn(call),
            std::mem::take(&mut self.tools),
        );
        ctx.spawn(
            request
                .into_actor(self)
                .map(move |(result, tools), act, ctx| {
                    act.tools = tools;
                    act.answered(call, prompt, sent, result, ctx)
                }),
        );
    }

    /// A call's context: cancelled with the actor; its streaming progress goes out as live
    /// notices.
    fn call(&self) -> LlmCall {
        let call = LlmCall::new(self.cancel.child_token());
        with_progress_notices(call, self.notices.as_ref(), self.run, Role::Planner, None)
    }

    fn answered(
        &mut self,
        call: u32,
        prompt: String,
        sent: String,
        result: Result<LlmResponse, LlmError>,
        ctx: &mut Context<Self>,
    ) {
        self.phase = Phase::Idle;
        // Calls count from 0 here and from 1 in the log, as tail and status show them.
        let number = call.saturating_add(1);
        match result {
            Ok(response) => {
                let mut tasks = parse_json_answer::<PlannerOutput>(
                    &response.content,
                    self.config.max_answer_bytes,
                )
                .map(|out| out.tasks)
                .map_err(|error| match response.finish {
                    // The parser's "EOF while parsing" says less than the provider did.
                    FinishReason::Length => format!(
                        "the answer was cut off at the output-token limit ({error}); \
                         answer with fewer and shorter tasks"
                    ),
                    _ => error.to_string(),
                });
                let planned = tasks.as_ref().map_or(0, Vec::len);
                self.planned_anything |= planned > 0;
                // An empty first sprint is more likely a lazy answer than a finished request:
                // recorded as not used (so the graph does not end planning), and asked once
                // more with a reminder. Not an error: no backoff, no count toward giving up.
                let remind = tasks.is_ok() && planned == 0 && self.reminder_due();
                if remind {
                    tasks = Err(EMPTY_FIRST_SPRINT.to_string());
                }
                let failed = tasks.as_ref().err().cloned();
                // What the conversation keeps is what the journal records: an answer that
                // was not used only as an excerpt.
                let exchange = Exchange::new(sent, response.content, failed.clone());
                self.conversation.record(exchange.clone());
                self.tools.rounds.clear();
                self.graph
                    .do_send(ToTaskGraph::PlannerAnswered(Box::new(PlannerAnswer {
                        call,
                        prompt: exchange.prompt,
                        content: exchange.answer,
                        usage: response.usage,
                        tasks,
                    })));
                match failed {
                    Some(_) if remind => {
                        info!(run = %self.run, call = number, "an empty first sprint; asking once more");
                        self.remind_empty = true;
                        self.plan(ctx);
                    }
                    Some(error) => {
                        warn!(run = %self.run, call = number, %error, "the planner's answer was unusable");
                        self.last_error = Some(error.clone());
                        self.back_off(error, ctx);
                    }
                    // The graph validates the batch; its verdict decides what this call was.
                    None if planned > 0 => self.phase = Phase::AwaitingVerdict,
                    None => {
                        self.consecutive_errors = 0;
                        self.plan_if_needed(ctx);
                    }
                }
            }
            // Too long for the model's context: asked again at once, with less.
            Err(error) if error.is_context_too_long() && self.conversation.compact() => {
                info!(run = %self.run, call = number, %error, compactions = self.conversation.compactions(), "the planner's request was too long; compacting");
                self.send(call, prompt, ctx);
            }
            // Still too long at the smallest size: an error like an unusable answer.
            Err(error) if error.is_context_too_long() => {
                warn!(run = %self.run, call = number, %error, "the planner's request is too long even compacted");
                self.back_off(error.to_string(), ctx);
            }
            // A refusal (bad key, unknown model) or a missing model will be the same on
            // every try: the run fails now, with the provider's reason, instead of after
            // max_consecutive_errors backoffs.
            Err(error) if !error.is_retryable() => {
                warn!(run = %self.run, call = number, %error, "the planner's LLM call failed for good");
                self.give_up(format!("the planner's model cannot be used: {error}"));
            }
            Err(error) => {
                warn!(run = %self.run, call = number, %error, "the planner's LLM call failed");
                let delay = match error {
                    LlmError::RateLimited { retry_after_ms } => Some(retry_after_ms),
                    _ => None,
                };
                self.back_off_for(error.to_string(), delay, ctx);
            }
        }
    }

    fn back_off(&mut self, error: String, ctx: &mut Context<Self>) {
        self.back_off_for(error, None, ctx);
    }

    /// Plans again if enough handoffs are waiting to be read and the new tasks could run
    /// soon (a worker slot is free) or a handoff needs a follow-up now.
    fn plan_if_needed(&mut self, ctx: &mut Context<Self>) {
        let enough = self.unread.len() >= self.config.min_handoffs_for_replan;
        let capacity = self.free_workers.is_none_or(|free| free > 0);
        if enough && (capacity || self.unread.iter().any(needs_attention)) {
            self.plan(ctx);
        }
    }

    fn back_off_for(&mut self, error: String, at_least_ms: Option<u64>, ctx: &mut Context<Self>) {
        self.consecutive_errors = self.consecutive_errors.saturating_add(1);
        if self.consecutive_errors >= self.config.max_consecutive_errors {
            self.give_up(format!(
                "{} consecutive planner errors; the last: {error}",
                self.consecutive_errors
            ));
            return;
        }
        let delay = backoff::delay_ms(
            self.config.backoff_base_ms,
            self.config.backoff_max_ms,
            self.consecutive_errors,
            at_least_ms,
        );
        self.phase = Phase::BackingOff;
        ctx.notify_later(ToPlanner::Retry, Duration::from_millis(delay));
    }

    /// Ends planning without failing the run: the run completes if its tasks do.
    fn finish(&mut self, reason: String) {
        info!(run = %self.run, %reason, "planning ends");
        self.phase = Phase::Done;
        self.graph.do_send(ToTaskGraph::PlanningFinished);
    }

    /// Ends planning and fails the run: the planner could not produce usable answers.
    fn give_up(&mut self, error: String) {
        info!(run = %self.run, %error, "the planner gives up");
        self.phase = Phase::Done;
        self.graph.do_send(ToTaskGraph::PlannerGaveUp { error });
    }
}

/// The most active tasks a follow-up lists, and the most locked paths.
const MAX_ACTIVE_LISTED: usize = 50;
const MAX_LOCKED_LISTED: usize = 200;

/// The active tasks and the paths running tasks hold, for a follow-up (bounded lists). Plans
/// that touch a locked path wait for it; saying so keeps the model from planning into it.
fn active_work(graph: &GraphSnapshot) -> String {
    let active: Vec<&TaskView> = graph
        .tasks
        .iter()
        .filter(|t| !t.state.is_terminal())
        .collect();
    if active.is_empty() {
        return "## Active tasks\nnone\n\n".to_string();
    }
    let mut msg = format!("## Active tasks ({})\n", active.len());
    for t in active.iter().take(MAX_ACTIVE_LISTED) {
        let description: String = t.description.chars().take(200).collect();
        msg.push_str(&format!(
            "{} [{}] {description} [{}]\n",
            t.id,
            t.state,
            t.scope.join(", ")
        ));
    }
    if active.len() > MAX_ACTIVE_LISTED {
        msg.push_str(&format!(
            "… and {} more\n",
            active.len() - MAX_ACTIVE_LISTED
        ));
    }
    msg.push('\n');
    let mut locked: Vec<&str> = active
        .iter()
        .filter(|t| matches!(t.state, TaskState::Dispatched | TaskState::Running))
        .flat_map(|t| t.scope.iter().map(String::as_str))
        .collect();
    locked.sort_unstable();
    locked.dedup();
    if !locked.is_empty() {
        msg.push_str(&format!(
            "## Locked file scopes ({} paths)\nRunning tasks are changing these; do not plan other work on them now:\n",
            locked.len()
        ));
        let shown: Vec<&str> = locked.iter().take(MAX_LOCKED_LISTED).copied().collect();
        msg.push_str(&shown.join(", "));
        if locked.len() > MAX_LOCKED_LISTED {
            msg.push_str(&format!(
                ", … and {} more",
                locked.len() - MAX_LOCKED_LISTED
            ));
        }
        msg.push_str("\n\n");
    }
    msg
}

/// A root task that did not simply get done: its follow-up should be planned now.
fn needs_attention(handoff: &RootHandoff) -> bool {
    handoff.state != TaskState::Completed
        || handoff
            .handoff
            .as_ref()
            .is_some_and(|h| h.status != HandoffStatus::Complete)
}

impl Actor for Planner {
    type Context = Context<Self>;

    fn stopped(&mut self, _: &mut Context<Self>) {
        self.cancel.cancel();
    }
}

impl Handler<ToPlanner> for Planner {
    type Result = ();

    fn handle(&mut self, msg: ToPlanner, ctx: &mut Context<Self>) {
        match msg {
            ToPlanner::Start | ToPlanner::Quiescent => self.plan(ctx),
            ToPlanner::Retry if self.phase == Phase::BackingOff => {
                self.phase = Phase::Idle;
                self.plan(ctx);
            }
            ToPlanner::Retry => {}
            ToPlanner::MergeHealth(health) => self.merge_health = Some(health),
            ToPlanner::Handoff(handoff) => {
                self.unread.push(*handoff);
                self.plan_if_needed(ctx);
            }
            ToPlanner::Capacity { free_workers } => {
                self.free_workers = Some(free_workers);
                self.plan_if_needed(ctx);
            }
            ToPlanner::BatchAccepted { ready } => {
                if self.phase == Phase::AwaitingVerdict {
                    self.phase = Phase::Idle;
                }
                // The batch's ready tasks are taking slots as this arrives; Dispatch's report
                // of what is left comes after it. Until then, count those slots as taken, so
                // that handoffs read during the call do not trigger another call at once.
                self.free_workers = self.free_workers.map(|free| free.saturating_sub(ready));
                self.consecutive_errors = 0;
                self.plan_if_needed(ctx);
            }
            // A refused batch is an error like an unparseable answer: it backs off, and
            // counts toward giving up, so a model that keeps proposing invalid batches
            // cannot drive a tight loop of calls.
            ToPlanner::BatchRejected { reason } => {
                let error = format!("the batch was refused: {reason}");
                self.conversation.mark_last_unused(error.clone());
                self.rejections.push(reason);
                if self.phase == Phase::AwaitingVerdict {
                    self.phase = Phase::Idle;
                }
                if self.phase == Phase::Idle {
                    self.back_off(error, ctx);
                }
            }
        }
    }
}

impl Handler<StopMember> for Planner {
    type Result = ();

    fn handle(&mut self, _: StopMember, ctx: &mut Context<Self>) {
        if let Some(lifeline) = &mut self.lifeline {
            lifeline.set_cause(StopCause::Finished);
        }
        ctx.stop();
    }
}
