//! What a retry is told about the attempt before it (ADR-031): `PreviousAttempt`, built from
//! the journaled `TaskRetried` (its `AttemptFailure` and the failed handoff's findings), so a
//! retry after a daemon restart is told the same. Every piece is escaped (terminal escapes
//! stripped, control and invisible characters shown as `\u{..}`) and bounded in bytes when
//! the value is made *and* when it is deserialized: no value of this type is ever unbounded,
//! whatever a gate printed or a journal holds. How an agent reads it is `flotilla::agents`.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::failure::AttemptFailure;
use super::handoff::Finding;

/// Bytes kept of the one-line reason (its start).
pub const MAX_REASON_BYTES: usize = 1024;
/// Bytes kept of a command line (its start).
pub const MAX_COMMAND_BYTES: usize = 256;
/// Bytes kept of a gate's or a verification's output (its end: where the error is).
pub const MAX_TAIL_BYTES: usize = 4 * 1024;
/// Paths kept of a list (then how many more), each at most [`MAX_PATH_BYTES`].
pub const MAX_PATHS: usize = 20;
pub const MAX_PATH_BYTES: usize = 256;
/// Other findings kept, each at most [`MAX_REASON_BYTES`].
pub const MAX_FINDINGS: usize = 5;
/// Bytes kept of a reviewer's comments (their start).
pub const MAX_REVIEW_BYTES: usize = 4 * 1024;
/// The most the text of a [`PreviousAttempt`] can hold, all fields together.
pub const MAX_PREVIOUS_ATTEMPT_BYTES: usize = MAX_REASON_BYTES
    + 2 * (MAX_COMMAND_BYTES + MAX_TAIL_BYTES + MAX_REASON_BYTES)
    + 2 * MAX_PATHS * MAX_PATH_BYTES
    + MAX_FINDINGS * MAX_REASON_BYTES
    + MAX_REVIEW_BYTES;

/// A command that failed on the previous attempt's work: the merge gate, or the run's
/// verification command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "UncheckedTail")]
pub struct CommandTail {
    command: String,
    /// How it ended (`exit code 1`), when known.
    exit: String,
    /// The end of its output.
    output_tail: String,
}

#[derive(Deserialize)]
struct UncheckedTail {
    command: String,
    #[serde(default)]
    exit: String,
    #[serde(default)]
    output_tail: String,
}

impl From<UncheckedTail> for CommandTail {
    fn from(raw: UncheckedTail) -> Self {
        CommandTail::new(&raw.command, &raw.exit, &raw.output_tail)
    }
}

impl CommandTail {
    pub fn new(command: &str, exit: &str, output: &str) -> Self {
        CommandTail {
            command: clean_head(command, false, MAX_COMMAND_BYTES),
            exit: clean_head(exit, false, MAX_REASON_BYTES),
            output_tail: clean_tail(output, MAX_TAIL_BYTES),
        }
    }

    pub fn command(&self) -> &str {
        &self.command
    }

    pub fn exit(&self) -> &str {
        &self.exit
    }

    pub fn output_tail(&self) -> &str {
        &self.output_tail
    }
}

/// Paths, at most [`MAX_PATHS`] kept, and how many more there were.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "UncheckedPaths")]
pub struct PathList {
    paths: Vec<String>,
    more: usize,
}

#[derive(Deserialize)]
struct UncheckedPaths {
    paths: Vec<String>,
    #[serde(default)]
    more: usize,
}

impl From<UncheckedPaths> for PathList {
    fn from(raw: UncheckedPaths) -> Self {
        let mut list = PathList::new(&raw.paths);
        list.more = list.more.saturating_add(raw.more);
        list
    }
}

impl PathList {
    pub fn new(paths: &[String]) -> Self {
        PathList {
            paths: paths
                .iter()
                .take(MAX_PATHS)
                .map(|p| clean_head(p, false, MAX_PATH_BYTES))
                .collect(),
            more: paths.len().saturating_sub(MAX_PATHS),
        }
    }

    pub fn paths(&self) -> &[String] {
        &self.paths
    }

    /// Paths there were beyond [`PathList::paths`].
    pub fn more(&self) -> usize {
        self.more
    }

    pub fn is_empty(&self) -> bool {
        self.paths.is_empty() && self.more == 0
    }

    /// Adds `others` (a finding's paths), up to the bound.
    fn extend(&mut self, others: &[String]) {
        for p in others {
            if self.paths.len() < MAX_PATHS {
                self.paths.push(clean_head(p, false, MAX_PATH_BYTES));
            } else {
                self.more = self.more.saturating_add(1);
            }
        }
    }
}

/// Why the attempt before this one failed, as its retry is told: the reason in one line,
/// and, when they apply, the merge gate's and the verification's output tails, the files it
/// changed outside its scope, the links it added outside the repository, other findings,
/// and a reviewer's comments. Bounded and escaped (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "UncheckedPrevious")]
pub struct PreviousAttempt {
    /// The attempt that failed.
    attempt: u32,
    reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gate: Option<CommandTail>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    verification: Option<CommandTail>,
    #[serde(default, skip_serializing_if = "PathList::is_empty")]
    out_of_scope: PathList,
    #[serde(default, skip_serializing_if = "PathList::is_empty")]
    links_outside: PathList,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    findings: Vec<String>,
    /// A reviewer's comments, when a review sent the work back (ADR-038: from
    /// `AttemptFailure::ChangesRequested`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    review: Option<String>,
    /// The failure lets the next attempt continue from this attempt's branch
    /// ([`AttemptFailure::continues_in_place`]), with `[worktrees] retry_in_place`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    continuable: bool,
    /// Where the retry's branch started, once its worktree is made (`None`: the option is
    /// off, and the retry starts from main as always).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    start: Option<RetryStart>,
}

/// Where a retry's branch started, with `[worktrees] retry_in_place` (ADR-031): its task
/// message says which.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetryStart {
    /// At the failed attempt's tip: its work is on the retry's branch.
    Continued,
    /// At main's tip: the failure does not allow continuing (a workspace or stale-base
    /// failure), or the failed attempt's branch is gone.
    FromMain,
}

#[derive(Deserialize)]
struct UncheckedPrevious {
    attempt: u32,
    reason: String,
    #[serde(default)]
    gate: Option<CommandTail>,
    #[serde(default)]
    verification: Option<CommandTail>,
    #[serde(default)]
    out_of_scope: PathList,
    #[serde(default)]
    links_outside: PathList,
    #[serde(default)]
    findings: Vec<String>,
    #[serde(default)]
    review: Option<String>,
    #[serde(default)]
    continuable: bool,
    #[serde(default)]
    start: Option<RetryStart>,
}

impl From<UncheckedPrevious> for PreviousAttempt {
    fn from(raw: UncheckedPrevious) -> Self {
        PreviousAttempt {
            attempt: raw.attempt,
            reason: clean_head(&raw.reason, true, MAX_REASON_BYTES),
            gate: raw.gate,
            verification: raw.verification,
            out_of_scope: raw.out_of_scope,
            links_outside: raw.links_outside,
            findings: bounded_findings(raw.findings.iter().map(String::as_str)),
            review: raw.review.map(|r| clean_head(&r, true, MAX_REVIEW_BYTES)),
            continuable: raw.continuable,
            start: raw.start,
        }
    }
}

fn bounded_findings<'a>(findings: impl Iterator<Item = &'a str>) -> Vec<String> {
    findings
        .take(MAX_FINDINGS)
        .map(|f| clean_head(f, false, MAX_REASON_BYTES))
        .collect()
}

impl PreviousAttempt {
    /// What attempt `attempt` left for the next one: its failure, and the findings of the
    /// handoff it reported (a failed verification, edits outside its scope that the run
    /// flags rather than fails).
    pub fn new(attempt: u32, failure: &AttemptFailure, findings: &[Finding]) -> Self {
        let mut previous = PreviousAttempt {
            attempt,
            reason: String::new(),
            gate: None,
            verification: None,
            out_of_scope: PathList::default(),
            links_outside: PathList::default(),
            findings: Vec::new(),
            review: None,
            continuable: failure.continues_in_place(),
            start: None,
        };
        // The typed sections carry the long parts; the reason stays one short sentence.
        let reason = match failure {
            AttemptFailure::GateFailed {
                command,
                output_tail,
            } => {
                previous.gate = Some(CommandTail::new(command, "", output_tail));
                "the merge gate failed on main with this attempt's work merged in".to_string()
            }
            AttemptFailure::OutOfScope { paths } => {
                previous.out_of_scope = PathList::new(paths);
                "it changed files outside the task's scope".to_string()
            }
            AttemptFailure::LinksOutside { paths } => {
                previous.links_outside = PathList::new(paths);
                "it added links that point outside the repository (or hard links)".to_string()
            }
            AttemptFailure::ChangesRequested { comments } => {
                previous.review = Some(clean_head(&review_text(comments), true, MAX_REVIEW_BYTES));
                "the reviewer asked for changes before this work may land".to_string()
            }
            other => other.to_string(),
        };
        previous.reason = clean_head(&reason, true, MAX_REASON_BYTES);
        let mut others = Vec::new();
        for finding in findings {
            match finding {
                Finding::VerificationFailed {
                    command,
                    exit,
                    output_tail,
                } if previous.verification.is_none() => {
                    previous.verification = Some(CommandTail::new(command, exit, output_tail));
                }
                Finding::OutOfScope { paths } => previous.out_of_scope.extend(paths),
                Finding::LinksOutside { paths } => previous.links_outside.extend(paths),
                other => others.push(other.to_string()),
            }
        }
        previous.findings = bounded_findings(others.iter().map(String::as_str));
        previous
    }

    /// The same, with a reviewer's comments (`new` takes them from a
    /// `ChangesRequested` failure; ADR-038).
    pub fn with_review(mut self, comments: &str) -> Self {
        self.review = Some(clean_head(comments, true, MAX_REVIEW_BYTES));
        self
    }

    /// The same, saying where the retry's branch started.
    pub fn starting(mut self, start: RetryStart) -> Self {
        self.start = Some(start);
        self
    }

    /// Whether the next attempt may continue from this attempt's branch.
    pub fn continuable(&self) -> bool {
        self.continuable
    }

    pub fn start(&self) -> Option<RetryStart> {
        self.start
    }

    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    pub fn reason(&self) -> &str {
        &self.reason
    }

    pub fn gate(&self) -> Option<&CommandTail> {
        self.gate.as_ref()
    }

    pub fn verification(&self) -> Option<&CommandTail> {
        self.verification.as_ref()
    }

    pub fn out_of_scope(&self) -> &PathList {
        &self.out_of_scope
    }

    pub fn links_outside(&self) -> &PathList {
        &self.links_outside
    }

    pub fn findings(&self) -> &[String] {
        &self.findings
    }

    pub fn review(&self) -> Option<&str> {
        self.review.as_deref()
    }

    /// Bytes of text the value holds (what its bound, [`MAX_PREVIOUS_ATTEMPT_BYTES`], is of).
    pub fn text_bytes(&self) -> usize {
        let tail = |t: &Option<CommandTail>| {
            t.as_ref()
                .map_or(0, |t| t.command.len() + t.exit.len() + t.output_tail.len())
        };
        let paths = |l: &PathList| l.paths.iter().map(String::len).sum::<usize>();
        self.reason.len()
            + tail(&self.gate)
            + tail(&self.verification)
            + paths(&self.out_of_scope)
            + paths(&self.links_outside)
            + self.findings.iter().map(String::len).sum::<usize>()
            + self.review.as_ref().map_or(0, String::len)
    }
}

/// A reviewer's comments as one text, one `- ` line each (ADR-038).
fn review_text(comments: &[String]) -> String {
    comments
        .iter()
        .map(|c| format!("- {c}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// At most the last `4 × MAX_TAIL_BYTES` bytes of `raw`, before cleaning: a 10 MB output is
/// never escaped whole only to keep its end.
fn tail_raw(raw: &str) -> &str {
    let keep = MAX_TAIL_BYTES.saturating_mul(4);
    if raw.len() <= keep {
        return raw;
    }
    let mut cut = raw.len() - keep;
    while !raw.is_char_boundary(cut) {
        cut += 1;
    }
    &raw[cut..]
}

/// Zero-width and bidirectional-formatting characters: invisible in a prompt, able to make
/// text read differently from what it is.
fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00ad}'
            | '\u{061c}'
            | '\u{180e}'
            | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{feff}'
            | '\u{fff9}'..='\u{fffb}'
            | '\u{e0000}'..='\u{e007f}'
    )
}

/// Text made safe to put in a prompt: terminal escape sequences (colours, titles) dropped,
/// carriage-return overwrites resolved to what a terminal would show, every other control
/// or invisible character written as `\u{..}`. Newlines stay when `keep_newlines` (tabs
/// always do).
fn clean(raw: &str, keep_newlines: bool) -> String {
    let mut out = String::with_capacity(raw.len().min(MAX_TAIL_BYTES * 4));
    for (i, line) in raw.split('\n').enumerate() {
        if i > 0 {
            out.push_str(if keep_newlines { "\n" } else { "\\u{a}" });
        }
        // What follows the last carriage return is what the line shows.
        let line = line.strip_suffix('\r').unwrap_or(line);
        let line = line.rsplit('\r').next().unwrap_or(line);
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\u{1b}' => match chars.peek() {
                    // CSI: parameters, then one final byte in @..~.
                    Some('[') => {
                        chars.next();
                        for n in chars.by_ref() {
                            if ('@'..='~').contains(&n) {
                                break;
                            }
                        }
                    }
                    // OSC: up to BEL or ESC \.
                    Some(']') => {
                        chars.next();
                        while let Some(n) = chars.next() {
                            if n == '\u{7}' {
                                break;
                            }
                            if n == '\u{1b}' {
                                if chars.peek() == Some(&'\\') {
                                    chars.next();
                                }
                                break;
                            }
                        }
                    }
                    _ => out.push_str("\\u{1b}"),
                },
                '\t' => out.push('\t'),
                c if c.is_control() || is_invisible(c) => {
                    let _ = write!(out, "\\u{{{:x}}}", c as u32);
                }
                c => out.push(c),
            }
        }
    }
    out
}

/// At most the first `4 × max` bytes of `raw`, before cleaning (see [`tail_raw`]).
fn head_raw(raw: &str, max: usize) -> &str {
    let mut cut = max.saturating_mul(4).min(raw.len());
    while !raw.is_char_boundary(cut) {
        cut -= 1;
    }
    &raw[..cut]
}

/// `raw` cleaned ([`clean`]) and cut to its first `max` bytes, `…` marking a cut (also
/// one made before cleaning, whose text cleaning then shrank).
pub(super) fn clean_head(raw: &str, keep_newlines: bool, max: usize) -> String {
    let part = head_raw(raw, max);
    let cleaned = clean(part, keep_newlines);
    let out = head(&cleaned, max);
    if part.len() == raw.len() || out.ends_with('…') {
        return out;
    }
    let mut out = head(&cleaned, max.saturating_sub('…'.len_utf8()));
    if !out.ends_with('…') {
        out.push('…');
    }
    out
}

/// `raw` cleaned and cut to its last `max` bytes, `…` marking a cut (see [`clean_head`]).
fn clean_tail(raw: &str, max: usize) -> String {
    let part = tail_raw(raw);
    let cleaned = clean(part, true);
    let out = tail(&cleaned, max);
    if part.len() == raw.len() || out.starts_with('…') {
        return out;
    }
    let out = tail(&cleaned, max.saturating_sub('…'.len_utf8()));
    if out.starts_with('…') {
        out
    } else {
        format!("…{out}")
    }
}

/// The first `max` bytes (at a character boundary), with `…` when cut.
fn head(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut cut = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &text[..cut])
}

/// The last `max` bytes (at a character boundary), with `…` when cut.
fn tail(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut cut = text.len() - max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(cut) {
        cut += 1;
    }
    format!("…{}", &text[cut..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gate_failure_keeps_the_command_and_the_end_of_its_output() {
        let failure = AttemptFailure::GateFailed {
            command: "cargo test (exit code 101)".into(),
            output_tail: "compiling\nerror[E0308]: mismatched types\n".into(),
        };
        let p = PreviousAttempt::new(1, &failure, &[]);
        assert_eq!(p.attempt(), 1);
        let gate = p.gate().unwrap();
        assert_eq!(gate.command(), "cargo test (exit code 101)");
        assert!(gate.output_tail().ends_with("mismatched types\n"));
        assert!(p.reason().contains("merge gate failed"), "{}", p.reason());
        assert!(
            !p.reason().contains("E0308"),
            "the tail is not in the reason"
        );
    }

    #[test]
    fn out_of_scope_paths_are_listed_and_bounded_in_number() {
        let paths: Vec<String> = (0..100).map(|i| format!("src/f{i}.rs")).collect();
        let p = PreviousAttempt::new(2, &AttemptFailure::OutOfScope { paths }, &[]);
        assert_eq!(p.out_of_scope().paths().len(), MAX_PATHS);
        assert_eq!(p.out_of_scope().paths()[0], "src/f0.rs");
        assert_eq!(p.out_of_scope().more(), 100 - MAX_PATHS);
    }

    #[test]
    fn a_reported_failure_carries_its_failed_verification_and_flagged_findings() {
        let findings = vec![
            Finding::VerificationFailed {
                command: "make check".into(),
                exit: "exit code 2".into(),
                output_tail: "FAIL test_add\n".into(),
            },
            Finding::OutOfScope {
                paths: vec!["README.md".into()],
            },
            Finding::EmptyDiff,
        ];
        let failure = AttemptFailure::Reported {
            summary: "tests fail".into(),
        };
        let p = PreviousAttempt::new(1, &failure, &findings);
        let v = p.verification().unwrap();
        assert_eq!((v.command(), v.exit()), ("make check", "exit code 2"));
        assert_eq!(v.output_tail(), "FAIL test_add\n");
        assert_eq!(p.out_of_scope().paths(), ["README.md".to_string()]);
        assert_eq!(p.findings().len(), 1);
        assert!(p.reason().contains("tests fail"));
    }

    #[test]
    fn changes_requested_fill_the_review_slot_one_line_per_comment() {
        let failure = AttemptFailure::ChangesRequested {
            comments: vec!["name it parse".into(), "add a \u{1b}[31mtest".into()],
        };
        let p = PreviousAttempt::new(1, &failure, &[]);
        assert_eq!(p.review(), Some("- name it parse\n- add a test"));
        assert!(
            p.reason().contains("reviewer asked for changes"),
            "{}",
            p.reason()
        );
        assert!(
            !p.reason().contains("name it parse"),
            "the comments are not in the reason"
        );
        let huge = AttemptFailure::ChangesRequested {
            comments: vec!["c".repeat(100_000)],
        };
        let p = PreviousAttempt::new(1, &huge, &[]);
        assert!(p.review().unwrap().len() <= MAX_REVIEW_BYTES);
        let failed = AttemptFailure::ReviewFailed {
            reason: "no usable verdict in 3 call(s)".into(),
        };
        let p = PreviousAttempt::new(1, &failed, &[]);
        assert_eq!(p.review(), None);
        assert!(
            p.reason().contains("review could not be done"),
            "{}",
            p.reason()
        );
    }

    #[test]
    fn crash_and_timeout_reasons_are_said() {
        let crash = AttemptFailure::Crashed {
            detail: "exit status 137".into(),
        };
        assert_eq!(
            PreviousAttempt::new(1, &crash, &[]).reason(),
            "the agent crashed: exit status 137"
        );
        let timeout = AttemptFailure::TimedOut { limit_ms: 60_000 };
        assert_eq!(
            PreviousAttempt::new(1, &timeout, &[]).reason(),
            "the attempt exceeded its time limit of 60000 ms"
        );
    }

    #[test]
    fn ten_megabytes_of_gate_output_stay_within_the_bound() {
        let huge = "x".repeat(10 * 1024 * 1024) + "\nthe last line\n";
        let failure = AttemptFailure::GateFailed {
            command: "y".repeat(1_000_000),
            output_tail: huge,
        };
        let findings = vec![Finding::VerificationFailed {
            command: "v".repeat(1_000_000),
            exit: "e".repeat(1_000_000),
            output_tail: "é".repeat(3_000_000),
        }];
        let p = PreviousAttempt::new(1, &failure, &findings).with_review(&"r".repeat(1_000_000));
        assert!(
            p.text_bytes() <= MAX_PREVIOUS_ATTEMPT_BYTES,
            "{}",
            p.text_bytes()
        );
        let gate = p.gate().unwrap();
        assert!(gate.output_tail().len() <= MAX_TAIL_BYTES);
        assert!(
            gate.output_tail().ends_with("the last line\n"),
            "the end is kept"
        );
        assert!(gate.output_tail().starts_with('…'), "the cut is marked");
        assert!(gate.command().len() <= MAX_COMMAND_BYTES);
        assert!(p.verification().unwrap().output_tail().len() <= MAX_TAIL_BYTES);
        assert!(p.review().unwrap().len() <= MAX_REVIEW_BYTES);
        assert!(serde_json::to_string(&p).unwrap().len() < 2 * MAX_PREVIOUS_ATTEMPT_BYTES);
    }

    #[test]
    fn a_cut_is_marked_even_when_cleaning_shrank_what_was_kept() {
        // Mostly colour codes: what survives cleaning is short, yet the text was cut.
        let colours = "\u{1b}[31m\u{1b}[0m".repeat(100_000);
        let failure = AttemptFailure::GateFailed {
            command: format!("{colours}end"),
            output_tail: format!("start{colours}"),
        };
        let p = PreviousAttempt::new(1, &failure, &[]);
        let gate = p.gate().unwrap();
        assert_eq!(gate.command(), "…");
        assert_eq!(gate.output_tail(), "…");
        let crash = AttemptFailure::Crashed {
            detail: format!("boom{colours}"),
        };
        assert_eq!(
            PreviousAttempt::new(1, &crash, &[]).reason(),
            "the agent crashed: boom…"
        );
    }

    #[test]
    fn control_characters_are_escaped_and_colours_dropped() {
        let failure = AttemptFailure::GateFailed {
            command: "test\u{1b}]0;pwned\u{7}\nrm -rf".into(),
            output_tail: "\u{1b}[31merror\u{1b}[0m: bad\rworse\u{0}\u{202e}txt.exe\tok\n".into(),
        };
        let p = PreviousAttempt::new(1, &failure, &[]);
        let gate = p.gate().unwrap();
        assert_eq!(
            gate.command(),
            "test\\u{a}rm -rf",
            "one line, no title change"
        );
        assert_eq!(gate.output_tail(), "worse\\u{0}\\u{202e}txt.exe\tok\n");
        let paths = AttemptFailure::OutOfScope {
            paths: vec!["a\u{1b}[2Jb\nc".into()],
        };
        let p = PreviousAttempt::new(1, &paths, &[]);
        assert_eq!(p.out_of_scope().paths(), ["ab\\u{a}c".to_string()]);
        assert!(!serde_json::to_string(&p).unwrap().contains('\u{1b}'));
    }

    #[test]
    fn a_deserialized_value_is_bounded_and_escaped_too() {
        let json = serde_json::json!({
            "attempt": 3,
            "reason": format!("\u{1b}[1m{}", "r".repeat(100_000)),
            "gate": {"command": "g\u{7}", "output_tail": "t".repeat(100_000)},
            "out_of_scope": {"paths": (0..50).map(|i| format!("p{i}")).collect::<Vec<_>>()},
            "findings": (0..50).map(|i| format!("f{i}")).collect::<Vec<_>>(),
            "review": "\u{202e}x",
        });
        let p: PreviousAttempt = serde_json::from_value(json).unwrap();
        assert!(p.reason().len() <= MAX_REASON_BYTES && p.reason().starts_with('r'));
        assert_eq!(p.gate().unwrap().command(), "g\\u{7}");
        assert_eq!(p.out_of_scope().paths().len(), MAX_PATHS);
        assert_eq!(p.out_of_scope().more(), 30);
        assert_eq!(p.findings().len(), MAX_FINDINGS);
        assert_eq!(p.review(), Some("\\u{202e}x"));
        // Made bounded, it survives a round trip unchanged.
        let again: PreviousAttempt =
            serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
        assert_eq!(again, p);
    }
}
