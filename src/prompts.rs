//! The system prompt of each role. The project's own (prompts/*.md) are built into the
//! binary; a `prompts_dir` in flotilla.toml overrides any of them with a file of the same
//! name. Overrides are read when the run is submitted and stored with the run's config, so a
//! resumed run keeps the prompts it started with.
//!
//! A prompt may name a run's limits as `{{placeholder}}` (see [`PLACEHOLDERS`]), so that what
//! it tells the model agrees with what flotilla enforces. Every placeholder must be known:
//! an unknown one is refused when the prompt is loaded, never sent to a model unfilled.

use std::collections::BTreeMap;

use flotilla_actors::config::Limits;
use flotilla_actors::protocol::Role;

use crate::sandbox::AgentSandbox;

/// The built-in prompts: (role, file name, text).
pub const BUILT_IN: [(Role, &str, &str); 5] = [
    (
        Role::Planner,
        "root-planner.md",
        include_str!("../prompts/root-planner.md"),
    ),
    (
        Role::Subplanner,
        "subplanner.md",
        include_str!("../prompts/subplanner.md"),
    ),
    (
        Role::Worker,
        "worker.md",
        include_str!("../prompts/worker.md"),
    ),
    (
        Role::Reconciler,
        "reconciler.md",
        include_str!("../prompts/reconciler.md"),
    ),
    (
        Role::Reviewer,
        "reviewer.md",
        include_str!("../prompts/reviewer.md"),
    ),
];

/// Every placeholder a prompt may use. `sandbox` is the worker's: what its commands get of
/// the run's sandbox and the network ([`for_worker`]).
pub const PLACEHOLDERS: [&str; 8] = [
    "sandbox",
    "max_subtasks",
    "max_subplanner_iterations",
    "max_depth",
    "subplanner_scope_threshold",
    "max_scope_paths",
    "max_description_bytes",
    "max_nodes",
];

/// What `{{sandbox}}` says where the agent is not known: nothing it could get wrong.
const SANDBOX_UNKNOWN: &str = "as the run's configuration sets it (network and all)";

/// The value of each placeholder for a run with `limits`, for an agent in `sandbox`.
fn values(limits: &Limits, sandbox: Option<&AgentSandbox>) -> [(&'static str, String); 8] {
    [
        (
            "sandbox",
            sandbox.map_or(SANDBOX_UNKNOWN.to_string(), AgentSandbox::phrase),
        ),
        ("max_subtasks", limits.max_subtasks.to_string()),
        (
            "max_subplanner_iterations",
            limits.max_subplanner_iterations.to_string(),
        ),
        ("max_depth", limits.max_depth.to_string()),
        (
            "subplanner_scope_threshold",
            limits.subplanner_scope_threshold.to_string(),
        ),
        ("max_scope_paths", limits.max_scope_paths.to_string()),
        (
            "max_description_bytes",
            limits.max_description_bytes.to_string(),
        ),
        ("max_nodes", limits.max_nodes.to_string()),
    ]
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PromptError {
    #[error("{file}: unknown placeholder {{{{{name}}}}}; known: {known}")]
    UnknownPlaceholder {
        file: String,
        name: String,
        known: String,
    },
    #[error("{file}: a `{{{{` is not closed by `}}}}`")]
    Unclosed { file: String },
    #[error("{file}: the prompt is empty")]
    Empty { file: String },
}

/// The names of the placeholders `template` uses, in order.
fn placeholders_in<'a>(template: &'a str, file: &str) -> Result<Vec<&'a str>, PromptError> {
    let mut names = Vec::new();
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        let after = &rest[start + 2..];
        let end = after.find("}}").ok_or_else(|| PromptError::Unclosed {
            file: file.to_string(),
        })?;
        names.push(after[..end].trim());
        rest = &after[end + 2..];
    }
    Ok(names)
}

/// Checks that `template` uses only known placeholders.
pub fn check(template: &str, file: &str) -> Result<(), PromptError> {
    if template.trim().is_empty() {
        return Err(PromptError::Empty {
            file: file.to_string(),
        });
    }
    for name in placeholders_in(template, file)? {
        if !PLACEHOLDERS.contains(&name) {
            return Err(PromptError::UnknownPlaceholder {
                file: file.to_string(),
                name: name.to_string(),
                known: PLACEHOLDERS.join(", "),
            });
        }
    }
    Ok(())
}

/// `template` with its placeholders filled from `limits` (checked with [`check`] first).
pub fn render(template: &str, limits: &Limits) -> String {
    render_for(template, limits, None)
}

fn render_for(template: &str, limits: &Limits, sandbox: Option<&AgentSandbox>) -> String {
    let values = values(limits, sandbox);
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else {
            out.push_str(&rest[start..]);
            return out;
        };
        let name = after[..end].trim();
        match values.iter().find(|(n, _)| *n == name) {
            Some((_, value)) => out.push_str(value),
            None => out.push_str(&rest[start..start + 2 + end + 2]),
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    out
}

/// Prompts from a `prompts_dir` that replace built-in ones, by file name.
pub type PromptOverrides = BTreeMap<String, String>;

/// The prompt `role` runs with: its override if the run has one, else the built-in one,
/// with placeholders filled.
pub fn for_role(role: Role, overrides: &PromptOverrides, limits: &Limits) -> String {
    role_prompt(role, overrides, limits, None)
}

/// The worker's prompt for an agent whose commands run in `sandbox` (ADR-032): it says
/// "without network access" only when the sandbox takes the network away.
pub fn for_worker(overrides: &PromptOverrides, limits: &Limits, sandbox: &AgentSandbox) -> String {
    role_prompt(Role::Worker, overrides, limits, Some(sandbox))
}

fn role_prompt(
    role: Role,
    overrides: &PromptOverrides,
    limits: &Limits,
    sandbox: Option<&AgentSandbox>,
) -> String {
    let (_, file, built_in) = BUILT_IN
        .iter()
        .find(|(r, _, _)| *r == role)
        .copied()
        .unwrap_or(BUILT_IN[0]);
    render_for(
        overrides.get(file).map_or(built_in, String::as_str),
        limits,
        sandbox,
    )
}

/// Checks stored overrides (a config that came in a request's body).
pub fn check_overrides(overrides: &PromptOverrides) -> Result<(), PromptError> {
    for (file, text) in overrides {
        if !BUILT_IN.iter().any(|(_, name, _)| name == file) {
            return Err(PromptError::UnknownPlaceholder {
                file: file.clone(),
                name: "(not a prompt file)".into(),
                known: BUILT_IN.map(|(_, name, _)| name).join(", "),
            });
        }
        check(text, file)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::tools::FinishArgs;
    use flotilla_actors::actors::planner::PlannerConfig;
    use flotilla_actors::actors::subplanner::SubplannerConfig;
    use flotilla_actors::actors::subplanner::context::proposals_from;
    use flotilla_actors::graph::RunGraph;
    use flotilla_actors::llm::output::{PlannerOutput, parse_json_answer, planner_answer_schema};
    use flotilla_actors::protocol::{EventKind, TaskSpec};

    #[test]
    fn every_placeholder_of_every_built_in_prompt_is_filled() {
        let limits = Limits {
            max_subtasks: 7,
            ..Limits::default()
        };
        for (role, file, text) in BUILT_IN {
            check(text, file).unwrap();
            let rendered = for_role(role, &PromptOverrides::new(), &limits);
            assert!(!rendered.contains("{{"), "{file} keeps a placeholder");
            assert!(!rendered.contains("}}"), "{file} keeps a placeholder");
        }
        // The limits the prompts state are the run's.
        let subplanner = for_role(Role::Subplanner, &PromptOverrides::new(), &limits);
        assert!(subplanner.contains("At most 7 subtasks"), "{subplanner}");
        assert!(
            PLACEHOLDERS
                .iter()
                .all(|p| values(&limits, None).iter().any(|(n, _)| n == p)),
            "every placeholder has a value"
        );
    }

    #[test]
    fn unknown_or_unclosed_placeholders_are_refused() {
        assert!(matches!(
            check("plan {{max_subtaks}} tasks", "p.md"),
            Err(PromptError::UnknownPlaceholder { name, .. }) if name == "max_subtaks"
        ));
        assert!(matches!(
            check("plan {{max_subtasks tasks", "p.md"),
            Err(PromptError::Unclosed { .. })
        ));
        assert!(matches!(
            check("  \n", "p.md"),
            Err(PromptError::Empty { .. })
        ));
        check("at most {{ max_subtasks }} tasks", "p.md").unwrap();
    }

    #[test]
    fn an_override_replaces_only_its_role() {
        let mut overrides = PromptOverrides::new();
        overrides.insert(
            "root-planner.md".into(),
            "Plan with {{max_depth}} levels".into(),
        );
        let limits = Limits::default();
        assert_eq!(
            for_role(Role::Planner, &overrides, &limits),
            "Plan with 3 levels"
        );
        assert!(for_role(Role::Subplanner, &overrides, &limits).starts_with("# Subplanner"));
    }

    /// The parent scope the subplanner prompt's examples are written for (their heading
    /// names it).
    const SUBPLANNER_EXAMPLE_PARENT: [&str; 4] = [
        "src/world/constants.rs",
        "src/world/chunk.rs",
        "src/world/noise.rs",
        "src/world/mesher.rs",
    ];

    /// The fenced ```json blocks of a prompt: its example answers.
    fn json_examples(text: &str) -> Vec<&str> {
        text.split("```json")
            .skip(1)
            .filter_map(|after| after.split("```").next())
            .map(str::trim)
            .collect()
    }

    /// A planner answer parsed as the actors parse it, held to the schema they send with
    /// it (a scratchpad; every task with a description, a scope and acceptance).
    fn planner_answer(file: &str, example: &str, max_bytes: usize) -> Vec<TaskSpec> {
        let out: PlannerOutput = parse_json_answer(example, max_bytes)
            .unwrap_or_else(|e| panic!("{file}: an example answer does not parse: {e}\n{example}"));
        let schema = planner_answer_schema();
        assert_eq!(
            schema["required"],
            serde_json::json!(["scratchpad", "tasks"])
        );
        assert!(
            out.scratchpad.is_some_and(|s| !s.trim().is_empty()),
            "{file}: an example answer has no scratchpad"
        );
        for task in &out.tasks {
            assert!(
                !task.description.trim().is_empty()
                    && !task.scope.is_empty()
                    && !task.acceptance.trim().is_empty(),
                "{file}: an example task lacks what the schema requires: {task:?}"
            );
        }
        out.tasks
    }

    /// Submits `tasks` as a root batch: the graph's own validation (sizes, path hygiene,
    /// dependency indexes and ids, cycles, duplicates) must accept them.
    fn accepted(graph: &mut RunGraph, file: &str, tasks: Vec<TaskSpec>) {
        let events = graph.submit(tasks).unwrap();
        for event in &events {
            assert!(
                !matches!(event, EventKind::TasksRejected { .. }),
                "{file}: an example batch is refused: {event:?}"
            );
        }
    }

    /// Every example answer in a built-in prompt is one flotilla accepts, read by the parser
    /// the role's actor uses: a prompt and the code cannot drift apart.
    #[test]
    fn every_example_answer_in_a_prompt_is_accepted_by_flotilla() {
        let limits = Limits::default();
        // The planner's examples are successive sprints of one run: later ones name tasks
        // the earlier ones created (t1, t2, …).
        let mut planner_run = RunGraph::new(limits.clone());
        for (role, file, _) in BUILT_IN {
            let text = for_role(role, &PromptOverrides::new(), &limits);
            let examples = json_examples(&text);
            assert!(!examples.is_empty(), "{file} shows no example answer");
            for example in examples {
                match role {
                    Role::Planner => {
                        let max = PlannerConfig::default().max_answer_bytes;
                        let tasks = planner_answer(file, example, max);
                        accepted(&mut planner_run, file, tasks);
                    }
                    Role::Reconciler => {
                        // Read as the Reconciler reads its model's words (ADR-032): one
                        // wording per fix task asked for.
                        let words = flotilla_actors::actors::reconciler::parse_answer(example, 1)
                            .unwrap_or_else(|e| panic!("{file}: the example answer: {e}"));
                        assert!(!words[0].acceptance.is_empty());
                    }
                    Role::Subplanner => {
                        let max = SubplannerConfig::default().max_answer_bytes;
                        let tasks = planner_answer(file, example, max);
                        let parent = SUBPLANNER_EXAMPLE_PARENT.map(String::from);
                        for path in &parent {
                            assert!(text.contains(path.as_str()), "{file} never names {path}");
                        }
                        let (kept, notes) =
                            proposals_from(tasks.clone(), &parent, limits.max_path_bytes);
                        assert!(
                            notes.is_empty(),
                            "{file}: an example loses tasks: {notes:?}"
                        );
                        assert_eq!(kept.len(), tasks.len());
                        assert!(kept.len() <= limits.max_subtasks);
                        accepted(&mut RunGraph::new(limits.clone()), file, tasks);
                    }
                    Role::Reviewer => {
                        // Read as the reviewer reads its model's answer (ADR-038).
                        let config =
                            flotilla_actors::actors::worker::review::ReviewerConfig::default();
                        let verdict =
                            flotilla_actors::actors::worker::review::parse_answer(example, &config)
                                .unwrap_or_else(|e| panic!("{file}: the example answer: {e}"));
                        assert!(!verdict.comments().is_empty());
                    }
                    Role::Worker => {
                        let handoff: FinishArgs = parse_json_answer(example, 256 * 1024)
                            .unwrap_or_else(|e| panic!("{file}: the example handoff: {e}"));
                        assert!(!handoff.summary.trim().is_empty());
                    }
                }
            }
        }
        // The run holds the first sprint's three tasks and the third sprint's two.
        assert_eq!(planner_run.len(), 5);
    }

    /// What the prompts say flotilla does or does not check is what it does.
    #[test]
    fn the_prompts_promise_only_what_the_code_does() {
        let limits = Limits::default();
        let prompt = |role| for_role(role, &PromptOverrides::new(), &limits);
        // The root planner's prompt asks for acceptance and never says flotilla refuses a
        // task without it: the graph takes one.
        let root = prompt(Role::Planner);
        assert!(!root.contains("refuses a batch in which"));
        let mut graph = RunGraph::new(limits.clone());
        let events = graph
            .submit(vec![TaskSpec::new("no acceptance", &["src/a.rs"])])
            .unwrap();
        assert!(
            !events
                .iter()
                .any(|e| matches!(e, EventKind::TasksRejected { .. })),
            "empty acceptance is refused from the root planner now: say so in root-planner.md"
        );
        // The subplanner prompt says a batch without acceptance is refused (ADR-032): the
        // graph refuses it, by the reason the Subplanner's next call carries.
        assert!(
            prompt(Role::Subplanner)
                .contains("flotilla refuses a batch in which a subtask has none")
        );
        let wide = ["src/a.rs", "src/b.rs", "src/c.rs", "src/d.rs"];
        let mut graph = RunGraph::new(limits.clone());
        graph.submit(vec![TaskSpec::new("wide", &wide)]).unwrap();
        let t1: flotilla_actors::protocol::TaskId = "t1".parse().unwrap();
        graph
            .dispatched(
                &t1,
                1,
                "subplanner",
                flotilla_actors::protocol::Route::Subplanner,
            )
            .unwrap();
        graph.started(&t1, 1).unwrap();
        let mut with = flotilla_actors::protocol::SubtaskProposal::new("a", &["src/a.rs"]);
        with.acceptance = "`cargo test a` exits 0".into();
        let without = flotilla_actors::protocol::SubtaskProposal::new("b", &["src/b.rs"]);
        let events = graph
            .subplanner_answered(flotilla_actors::protocol::SubplannerAnswer {
                task: t1,
                attempt: 1,
                call: 0,
                prompt: String::new(),
                content: String::new(),
                usage: Default::default(),
                reported: Vec::new(),
                subtasks: Ok(vec![with, without]),
            })
            .unwrap();
        assert!(
            events.iter().any(|e| matches!(
                e,
                EventKind::DecompositionRejected {
                    reason: flotilla_actors::protocol::RejectionReason::EmptyAcceptance {
                        subtask: 1
                    },
                    ..
                }
            )),
            "{events:?}"
        );
        assert_eq!(graph.len(), 1, "the graph is unchanged");
        // "Without network access" only where the sandbox takes it away (ADR-032): the
        // worker's prompt says what the agent's commands get under the run's policy.
        use crate::sandbox::{SandboxConfig, SandboxMode, SandboxPolicy};
        let says = |config: &SandboxConfig, asks: bool| {
            let policy = SandboxPolicy::for_run(config, &[], std::path::Path::new("/repo"));
            for_worker(&PromptOverrides::new(), &limits, &policy.for_agent(asks))
        };
        let bwrap = SandboxConfig::default();
        assert!(says(&bwrap, false).contains("in the run's sandbox: without network access"));
        let no_network = |text: &str| {
            let lower = text.to_lowercase();
            lower.contains("without network") || lower.contains("no network")
        };
        assert!(
            !no_network(&says(&bwrap, true)),
            "an agent with sandbox = \"network\""
        );
        assert!(says(&bwrap, true).contains("with the host's network"));
        let none = SandboxConfig {
            mode: SandboxMode::None,
            ..SandboxConfig::default()
        };
        assert!(
            !no_network(&says(&none, false)),
            "[sandbox] mode = \"none\""
        );
        assert!(
            !says(&none, false).contains("read-only"),
            "no confinement promised"
        );
        assert!(says(&bwrap, false).contains("everything outside your worktree read-only"));
        let ports = SandboxConfig {
            allow_tcp_ports: Some(vec![443]),
            ..SandboxConfig::default()
        };
        assert!(says(&ports, true).contains("TCP connections only to port 443"));
        assert!(says(&ports, false).contains("without network access"));
        // A change outside the scope fails the attempt, or only is reported where the run's
        // `[checks] out_of_scope = "flag"`: the prompt claims no more than both do.
        use flotilla_actors::actors::worker::check::{ChecksConfig, OutOfScopePolicy};
        assert_eq!(ChecksConfig::default().out_of_scope, OutOfScopePolicy::Fail);
        assert!(prompt(Role::Worker).contains("is caught, and fails the task or is reported"));
        // Where the agent is unknown the prompt promises nothing about the network.
        assert!(!no_network(&prompt(Role::Worker)));
        // The run_command tool says nothing of the network itself: the prompt does.
        let run_command = crate::agents::tools::specs()
            .into_iter()
            .find(|spec| spec.name == "run_command")
            .unwrap();
        assert!(
            !no_network(&run_command.description),
            "{}",
            run_command.description
        );
        assert!(
            !run_command
                .description
                .to_lowercase()
                .contains("network access")
        );
        assert_eq!(
            crate::sandbox::SandboxConfig::default().mode,
            crate::sandbox::SandboxMode::Bwrap
        );
        assert_eq!(
            crate::agents::builtin::BuiltinConfig::default().sandbox,
            flotilla_actors::ports::Sandbox::Bwrap
        );
    }
}
