//! Bounded conversations (ADR-030): what one request to a model may carry, for the Planner,
//! the Subplanner and the built-in agent alike.
//!
//! A planner's request is the system prompt, the **fixed first message** (the request or
//! parent task and the repository as it was), the **latest scratchpad** (from the latest
//! answer that was used, carried even when that answer is no longer shown), the **last K
//! exchanges** that fit, and the new prompt; all within a [`ContextBudget`] of bytes and
//! approximate tokens set per role. Parts that cannot be dropped are cut to an
//! [`excerpt`] (head and tail) when they alone exceed the budget, so a request never
//! exceeds `max(limit, system prompt + MIN_REST_BYTES)` bytes of messages.
//!
//! An answer that was not used (unparseable, or a batch the graph refused) is kept only as
//! a bounded excerpt with the reason ([`Exchange::new`]), in memory, in the journal and in
//! every later request. A context-length refusal from the provider halves what the next
//! request may carry, from the size of the one refused ([`BoundedConversation::compact`],
//! [`halved`]), at most [`MAX_COMPACTIONS`] times, and the caller asks again.
//!
//! The built-in agent's tool loop is bounded by [`compact_turns`]: old tool outputs become a
//! short summary, old words of the model an excerpt, then whole old turns are dropped.
//!
//! Pure code: no actor, no I/O. Memory is bounded too: a conversation holds its first
//! exchange and its last K.

use std::borrow::Cow;
use std::collections::VecDeque;

use crate::llm::output::{PlannerOutput, parse_json_answer};
use crate::ports::{ChatMessage, ChatRole};

/// What one request of a role may carry (`[planner]`, `[subplanner]`, `[builtin_agent]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextBudget {
    /// Bytes of every message's text, the system prompt included.
    pub max_bytes: usize,
    /// Approximate tokens (about four characters a token, as providers that report no
    /// usage are estimated): at most four bytes a token are allowed.
    pub max_tokens: u64,
    /// Exchanges (planners) or tool outputs (the built-in agent) kept whole, the newest.
    pub keep_recent: usize,
}

/// How many times context-length refusals halve a conversation's limit.
pub const MAX_COMPACTIONS: u32 = 4;
/// What the messages besides the system prompt may always use, however small the limit.
pub const MIN_REST_BYTES: usize = 2 * 1024;
/// What is kept of an answer that was not used.
pub const UNUSED_ANSWER_BYTES: usize = 2 * 1024;
/// What is kept of the reason an answer was not used.
const UNUSED_REASON_BYTES: usize = 1024;
/// The most of a carried scratchpad a request shows.
pub const MAX_CARRIED_BYTES: usize = 16 * 1024;
/// The longest marker [`excerpt`] puts between head and tail.
const MARKER_MAX: usize = 48;

impl ContextBudget {
    /// The bytes a request may carry: the byte cap or four bytes a token, whichever is
    /// smaller.
    pub fn limit(&self) -> usize {
        let from_tokens = usize::try_from(self.max_tokens.saturating_mul(4)).unwrap_or(usize::MAX);
        self.max_bytes.min(from_tokens)
    }
}

/// The ceiling after a context-length refusal of a request of `refused_bytes`: half of it
/// (and never above the ceiling before), so that each try is smaller than the last.
pub fn halved(ceiling: usize, refused_bytes: usize) -> usize {
    ceiling.min(refused_bytes / 2)
}

/// `text` cut to at most `max_bytes`: its head and its tail around a line that says how
/// much was left out. Whole when it fits; cutting an excerpt again to the same size
/// changes nothing.
pub fn excerpt(text: &str, max_bytes: usize) -> Cow<'_, str> {
    if text.len() <= max_bytes {
        return Cow::Borrowed(text);
    }
    if max_bytes < 2 * MARKER_MAX {
        return Cow::Borrowed(&text[..floor_boundary(text, max_bytes)]);
    }
    let room = max_bytes - MARKER_MAX;
    let head = floor_boundary(text, room - room / 2);
    let tail = ceil_boundary(text, text.len() - room / 2);
    Cow::Owned(format!(
        "{}\n[… {} bytes omitted …]\n{}",
        &text[..head],
        tail - head,
        &text[tail..]
    ))
}

fn floor_boundary(text: &str, mut at: usize) -> usize {
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

fn ceil_boundary(text: &str, mut at: usize) -> usize {
    while !text.is_char_boundary(at) {
        at += 1;
    }
    at
}

/// Caps for parts of `sizes` so that together they take at most `total`: parts smaller
/// than an equal share stay whole, the larger ones get the same cap.
fn water_fill(sizes: &[usize], total: usize) -> Vec<usize> {
    if sizes.iter().fold(0usize, |a, s| a.saturating_add(*s)) <= total {
        return sizes.to_vec();
    }
    let mut sorted = sizes.to_vec();
    sorted.sort_unstable();
    let (mut left, mut parts) = (total, sorted.len());
    let mut cap = 0;
    for s in sorted {
        if s.saturating_mul(parts) <= left {
            left -= s;
            parts -= 1;
        } else {
            cap = left / parts.max(1);
            break;
        }
    }
    sizes.iter().map(|s| (*s).min(cap)).collect()
}

/// One recorded call of a planner's conversation: the prompt as sent and the answer as kept.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Exchange {
    pub prompt: String,
    pub answer: String,
    /// Why the answer was not used (unusable, or its batch refused): it is kept and shown
    /// only as an excerpt, with this reason.
    pub unused: Option<String>,
}

impl Exchange {
    /// An exchange as a conversation keeps it (and the journal records it): an answer that
    /// was not used is cut to [`UNUSED_ANSWER_BYTES`].
    pub fn new(prompt: String, answer: String, unused: Option<String>) -> Self {
        let answer = match &unused {
            Some(_) => excerpt(&answer, UNUSED_ANSWER_BYTES).into_owned(),
            None => answer,
        };
        Exchange {
            prompt,
            answer,
            unused,
        }
    }

    /// The answer as a request shows it.
    fn shown_answer(&self) -> Cow<'_, str> {
        match &self.unused {
            None => Cow::Borrowed(&self.answer),
            Some(reason) => Cow::Owned(format!(
                "[flotilla: this answer was not used: {}]\n{}",
                excerpt(reason, UNUSED_REASON_BYTES),
                excerpt(&self.answer, UNUSED_ANSWER_BYTES)
            )),
        }
    }

    fn shown_bytes(&self) -> usize {
        self.prompt.len() + self.shown_answer().len()
    }
}

/// The scratchpad of the latest answer that was used, and which call gave it.
#[derive(Debug, Clone, PartialEq)]
struct Carried {
    call: u32,
    text: String,
}

/// A planner's conversation, bounded: what it remembers and what each request carries.
#[derive(Debug, Clone)]
pub struct BoundedConversation {
    budget: ContextBudget,
    max_answer_bytes: usize,
    /// Call 0: its prompt is the fixed first message.
    first: Option<Exchange>,
    /// The newest calls after the first, at most `budget.keep_recent`, with their numbers.
    recent: VecDeque<(u32, Exchange)>,
    calls: u32,
    carried: Option<Carried>,
    /// The carried scratchpad before the last one, in case the last answer's batch is
    /// refused after it was recorded.
    carried_before: Option<Carried>,
    compactions: u32,
    /// What requests may carry since the last context-length refusal ([`halved`]).
    ceiling: usize,
    /// The size of the last request built: what a refusal halves.
    last_request_bytes: usize,
}

/// One request, built.
#[derive(Debug, Clone, PartialEq)]
pub struct BuiltRequest {
    pub messages: Vec<ChatMessage>,
    /// The new prompt as sent (cut if it alone did not fit): what the journal records.
    pub prompt: String,
    /// Earlier answers the request does not show.
    pub omitted: u32,
}

impl BuiltRequest {
    /// Bytes of every message's text.
    pub fn bytes(&self) -> usize {
        self.messages.iter().map(message_bytes).sum()
    }
}

impl BoundedConversation {
    /// An empty conversation; answers are parsed (for their scratchpad) up to
    /// `max_answer_bytes`.
    pub fn new(budget: ContextBudget, max_answer_bytes: usize) -> Self {
        BoundedConversation {
            budget,
            max_answer_bytes,
            first: None,
            recent: VecDeque::new(),
            calls: 0,
            carried: None,
            carried_before: None,
            compactions: 0,
            ceiling: usize::MAX,
            last_request_bytes: 0,
        }
    }

    /// A conversation recorded in the journal, continued: the same window and carried
    /// scratchpad as if it had never stopped.
    pub fn resume(
        budget: ContextBudget,
        max_answer_bytes: usize,
        exchanges: impl IntoIterator<Item = Exchange>,
    ) -> Self {
        let mut conversation = Self::new(budget, max_answer_bytes);
        for exchange in exchanges {
            conversation.record(exchange);
        }
        conversation
    }

    /// Calls recorded so far (the next call's number).
    pub fn calls(&self) -> u32 {
        self.calls
    }

    pub fn is_empty(&self) -> bool {
        self.calls == 0
    }

    /// The scratchpad a request carries: the latest used answer's.
    pub fn scratchpad(&self) -> Option<&str> {
        self.carried.as_ref().map(|c| c.text.as_str())
    }

    /// Context-length refusals taken into account so far.
    pub fn compactions(&self) -> u32 {
        self.compactions
    }

    /// Records a call's exchange (build it with [`Exchange::new`]).
    pub fn record(&mut self, exchange: Exchange) {
        let call = self.calls;
        if exchange.unused.is_none() {
            let scratchpad =
                parse_json_answer::<PlannerOutput>(&exchange.answer, self.max_answer_bytes)
                    .ok()
                    .and_then(|out| out.scratchpad)
                    .filter(|s| !s.trim().is_empty());
            if let Some(text) = scratchpad {
                self.carried_before = self.carried.replace(Carried { call, text });
            }
        }
        if call == 0 {
            self.first = Some(exchange);
        } else {
            self.recent.push_back((call, exchange));
            while self.recent.len() > self.budget.keep_recent {
                self.recent.pop_front();
            }
        }
        self.calls = self.calls.saturating_add(1);
    }

    /// The last answer was not used after all (its batch was refused): from now on it is
    /// an excerpt with `reason`, and its scratchpad is not carried.
    pub fn mark_last_unused(&mut self, reason: String) {
        let Some(last) = self.calls.checked_sub(1) else {
            return;
        };
        let exchange = match self.recent.back_mut() {
            Some((call, exchange)) if *call == last => exchange,
            _ if last == 0 => match self.first.as_mut() {
                Some(first) => first,
                None => return,
            },
            _ => return,
        };
        if exchange.unused.is_none() {
            let kept = std::mem::take(exchange);
            *exchange = Exchange::new(kept.prompt, kept.answer, Some(reason));
            if self.carried.as_ref().is_some_and(|c| c.call == last) {
                self.carried = self.carried_before.take();
            }
        }
    }

    /// The last request was refused as too long for the model's context: the next ones
    /// get half its size. `false` after [`MAX_COMPACTIONS`]: the caller treats the refusal
    /// as an error.
    pub fn compact(&mut self) -> bool {
        if self.compactions >= MAX_COMPACTIONS {
            return false;
        }
        self.compactions += 1;
        self.ceiling = halved(self.ceiling, self.last_request_bytes);
        true
    }

    /// The request for the next call: `system`, the fixed first message, the carried
    /// scratchpad, the newest exchanges that fit and `prompt`.
    pub fn request(&mut self, system: &str, prompt: &str) -> BuiltRequest {
        self.request_leaving(system, prompt, 0)
    }

    /// [`request`](Self::request), leaving `room` bytes of the limit for what the caller
    /// appends (a call's tool rounds, ADR-037).
    pub fn request_leaving(&mut self, system: &str, prompt: &str, room: usize) -> BuiltRequest {
        let built = self.build(system, prompt, room);
        self.last_request_bytes = built.bytes();
        built
    }

    /// The bytes a request may carry now: the budget's, or less after context-length
    /// refusals.
    pub fn limit(&self) -> usize {
        self.budget.limit().min(self.ceiling)
    }

    fn build(&self, system: &str, prompt: &str, room: usize) -> BuiltRequest {
        let limit = self.limit().saturating_sub(room);
        let rest = limit.saturating_sub(system.len()).max(MIN_REST_BYTES);
        let Some(first) = &self.first else {
            let prompt = excerpt(prompt, rest).into_owned();
            return BuiltRequest {
                messages: vec![
                    ChatMessage::system(system),
                    ChatMessage::user(prompt.clone()),
                ],
                prompt,
                omitted: 0,
            };
        };
        // The parts that cannot be dropped share the room first; the stand-in for omitted
        // answers is reserved at its largest (with the whole carried scratchpad).
        let scratch = self
            .carried
            .as_ref()
            .map(|c| excerpt(&c.text, MAX_CARRIED_BYTES));
        let note_room = stand_in(self.calls, 0, None).len() + 64;
        let scratch_len = scratch.as_ref().map_or(0, |s| s.len());
        let caps = water_fill(
            &[first.prompt.len(), prompt.len(), scratch_len],
            rest.saturating_sub(note_room),
        );
        let first_sent = excerpt(&first.prompt, caps[0]);
        let prompt_sent = excerpt(prompt, caps[1]).into_owned();
        let reserved = note_room + caps[2];
        let mut left = rest.saturating_sub(first_sent.len() + prompt_sent.len() + reserved);
        // The newest exchanges, whole, as long as they fit; the window has no holes.
        let mut shown: Vec<(u32, &Exchange)> = Vec::new();
        for (call, exchange) in self.recent.iter().rev() {
            let size = exchange.shown_bytes();
            if size > left {
                break;
            }
            left -= size;
            shown.push((*call, exchange));
        }
        shown.reverse();
        let contiguous = shown
            .first()
            .map_or(self.calls == 1, |(call, _)| *call == 1)
            && shown.len() == self.recent.len();
        let first_answer = first.shown_answer();
        let show_first = contiguous && first_answer.len() <= left + reserved;
        let shown_count = u32::try_from(shown.len()).unwrap_or(u32::MAX);
        let omitted = self
            .calls
            .saturating_sub(shown_count)
            .saturating_sub(u32::from(show_first));
        let slot = if show_first {
            first_answer.into_owned()
        } else {
            let carried = self
                .carried
                .as_ref()
                .filter(|c| !shown.iter().any(|(call, _)| *call == c.call))
                .zip(scratch.as_ref())
                .map(|(c, text)| (c.call, excerpt(text, reserved.saturating_sub(note_room))));
            stand_in(
                self.calls,
                omitted,
                carried.as_ref().map(|(c, t)| (*c, t.as_ref())),
            )
        };
        let mut messages = Vec::with_capacity(4 + 2 * shown.len());
        messages.push(ChatMessage::system(system));
        messages.push(ChatMessage::user(first_sent.into_owned()));
        messages.push(ChatMessage::assistant(slot));
        for (_, exchange) in shown {
            messages.push(ChatMessage::user(exchange.prompt.clone()));
            messages.push(ChatMessage::assistant(exchange.shown_answer().into_owned()));
        }
        messages.push(ChatMessage::user(prompt_sent.clone()));
        BuiltRequest {
            messages,
            prompt: prompt_sent,
            omitted,
        }
    }
}

/// What stands in the place of the first answer when answers are omitted: how many, and
/// the carried scratchpad (call number, text) if no shown answer holds it.
fn stand_in(calls: u32, omitted: u32, carried: Option<(u32, &str)>) -> String {
    let mut text = format!(
        "[flotilla: {omitted} of the {calls} earlier answers in this conversation are not shown, \
         to keep the request within its context budget; their tasks were handled as before.]"
    );
    if let Some((call, scratchpad)) = carried {
        text.push_str(&format!(
            "\nMy scratchpad, from my latest used answer (call {}):\n{scratchpad}",
            call.saturating_add(1)
        ));
    }
    text
}

fn message_bytes(m: &ChatMessage) -> usize {
    m.content.len()
        + m.tool_calls
            .iter()
            .map(|c| c.arguments.len() + c.name.len())
            .sum::<usize>()
}

/// A tool output older than the kept ones becomes this much of its head, with its size.
const TOOL_SUMMARY_BYTES: usize = 100;
/// An old message of the model's is cut to this.
const OLD_WORDS_BYTES: usize = 1024;
/// Tool-call arguments longer than this are replaced in old turns.
const LONG_ARGUMENTS: usize = 200;

/// Bounds the built-in agent's conversation in place: the first `fixed` messages (the
/// system prompt, the task) are never touched; the rest is shrunk until it fits `limit`
/// bytes, in this order, oldest first:
/// 1. tool outputs before the newest `keep_recent` become a one-line summary with their
///    head, and long tool-call arguments a small JSON object saying their size;
/// 2. the model's old words become an excerpt;
/// 3. whole old turns (an assistant message and the tool results and messages that follow
///    it) are dropped, and the first kept turn says how many were (`dropped` counts them
///    across calls), so the conversation stays well formed;
/// 4. the messages left share what room there is, each cut to an excerpt.
pub fn compact_turns(
    messages: &mut Vec<ChatMessage>,
    fixed: usize,
    limit: usize,
    keep_recent: usize,
    dropped: &mut u32,
) {
    let fixed = fixed.min(messages.len());
    let total = |m: &[ChatMessage]| m.iter().map(message_bytes).sum::<usize>();
    if total(messages) <= limit {
        return;
    }
    // 1 and 2: everything before the oldest of the outputs kept whole.
    let tools: Vec<usize> = (fixed..messages.len())
        .filter(|&i| messages[i].role == ChatRole::Tool)
        .collect();
    let cutoff = tools
        .len()
        .checked_sub(keep_recent)
        .and_then(|old| tools.get(old).copied())
        .unwrap_or(if keep_recent == 0 {
            messages.len()
        } else {
            fixed
        });
    for i in fixed..cutoff {
        if total(messages) <= limit {
            return;
        }
        let message = &mut messages[i];
        match message.role {
            ChatRole::Tool if !message.content.starts_with("[compacted:") => {
                let before = message.content.len();
                let head = excerpt(&message.content, TOOL_SUMMARY_BYTES);
                let head = head.split("\n[…").next().unwrap_or_default();
                message.content =
                    format!("[compacted: {before} bytes of tool output; it began: {head}]");
            }
            ChatRole::Assistant => {
                for call in message.tool_calls.iter_mut() {
                    let before = call.arguments.len();
                    if before > LONG_ARGUMENTS {
                        call.arguments =
                            format!("{{\"compacted\":\"{before} bytes of arguments\"}}");
                    }
                }
                if message.content.len() > OLD_WORDS_BYTES {
                    message.content = excerpt(&message.content, OLD_WORDS_BYTES).into_owned();
                }
            }
            _ => {}
        }
    }
    // 3: whole turns, oldest first, keeping at least the last one.
    let turn_starts = |m: &[ChatMessage]| -> Vec<usize> {
        (fixed..m.len())
            .filter(|&i| m[i].role == ChatRole::Assistant)
            .collect()
    };
    let mut dropped_now = 0u32;
    loop {
        if total(messages) <= limit {
            break;
        }
        let starts = turn_starts(messages);
        if starts.len() < 2 {
            break;
        }
        // Anything before the first turn (a message after the fixed ones) goes with it.
        messages.drain(fixed..starts[1]);
        dropped_now += 1;
    }
    if dropped_now > 0 {
        *dropped = dropped.saturating_add(dropped_now);
        let note = format!(
            "[flotilla: {} earlier turns of this conversation were dropped to fit its context budget]\n",
            dropped
        );
        // The first message after the kept turn's assistant message carries the note (a
        // tool result or flotilla's own words), replacing an older note.
        if let Some(follower) = messages
            .iter_mut()
            .skip(fixed)
            .find(|m| m.role != ChatRole::Assistant)
        {
            let body = match follower.content.strip_prefix("[flotilla: ") {
                Some(rest) if rest.contains(" earlier turns") => rest
                    .split_once('\n')
                    .map_or("", |(_, body)| body)
                    .to_string(),
                _ => std::mem::take(&mut follower.content),
            };
            follower.content = format!("{note}{body}");
        }
    }
    // 4: what is left shares the room.
    let fixed_bytes = total(&messages[..fixed]);
    if total(messages) <= limit {
        return;
    }
    let room = limit.saturating_sub(fixed_bytes).max(MIN_REST_BYTES);
    let sizes: Vec<usize> = messages[fixed..].iter().map(message_bytes).collect();
    let caps = water_fill(&sizes, room);
    for (message, cap) in messages[fixed..].iter_mut().zip(caps) {
        if message_bytes(message) <= cap {
            continue;
        }
        for call in message.tool_calls.iter_mut() {
            if call.arguments.len() > LONG_ARGUMENTS {
                call.arguments = format!(
                    "{{\"compacted\":\"{} bytes of arguments\"}}",
                    call.arguments.len()
                );
            }
        }
        let calls_bytes = message_bytes(message) - message.content.len();
        message.content = excerpt(&message.content, cap.saturating_sub(calls_bytes)).into_owned();
    }
}

#[cfg(test)]
#[path = "conversation_tests.rs"]
mod tests;
