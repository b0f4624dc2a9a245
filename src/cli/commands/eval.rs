//! `flotilla eval`: runs flotilla on each tiny project of an evaluation folder (`evals/`)
//! through the daemon, then runs the project's acceptance tests on what landed on main,
//! and reports per project and in total: acceptance tests passed, tasks landed first try,
//! retries, fix tasks, tokens, wall time and the largest prompt a planner was sent.
//!
//! A project is a folder with `eval.toml` (the request, the acceptance command and how many
//! tests it counts), `repo/` (the starting files, its `flotilla.toml` among them),
//! `acceptance/` (the tests) and `scripted.toml` (a scenario that solves it, for
//! `--scripted`). The agents never see the acceptance tests: the run's repository is made
//! from `repo/` alone, and the run's sandbox hides the project's folder (`[sandbox]
//! hidden`). The tests run afterwards, sandboxed too, in a clone of main with
//! `acceptance/` copied in; each prints `ok …` or `not ok …` lines, and a test that
//! printed neither (a build that broke) counts as failed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use flotilla_actors::ports::{CommandSpec, Exit as CommandExit, ProcessRunner};
use flotilla_actors::protocol::{Event, EventKind};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::api::report::RunReport;
use crate::api::runs::CreateRun;
use crate::cli::client::{Client, segment};
use crate::cli::error::{CliError, ErrorKind, Exit};
use crate::cli::{emit, note};
use crate::config::RunConfig;
use crate::process::ConfinedRunner;
use crate::sandbox::{SandboxConfig, SandboxPolicy};
use crate::text_safety;

/// `eval.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct EvalSpec {
    /// What the user asks flotilla for.
    request: String,
    /// A shell command line run in a clone of main with `acceptance/` copied in.
    acceptance: String,
    /// How many tests the acceptance command runs: the denominator, whatever it prints.
    tests: u32,
    /// The run's limit, from submit to its end.
    #[serde(default = "default_timeout")]
    timeout_secs: u64,
}

fn default_timeout() -> u64 {
    3600
}

/// How long the acceptance tests may take.
const ACCEPTANCE_LIMIT: Duration = Duration::from_secs(600);

/// Which models the runs use.
pub enum Models<'a> {
    /// Each project's own `flotilla.toml`.
    Project,
    /// `[providers]`, `[roles]` and `[prices]` of this file replace the project's.
    From(&'a Path),
    /// The project's `scripted.toml` plays every role: the harness's own test.
    Scripted,
}

/// Who plans the runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Planning {
    /// The planner and Subplanner roles' models (or the scenario, with `Models::Scripted`).
    Models,
    /// The project's `scripted.toml` plans; the workers (and any other role) keep their
    /// models. A small model that never plans a task still gets its workers measured.
    Scripted,
}

/// One project's result: a row of the table.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct EvalRow {
    pub project: String,
    pub run: Option<String>,
    /// `completed`, `failed`, `cancelled`, `timed out` or why the run could not start.
    pub outcome: String,
    pub acceptance_passed: u32,
    pub acceptance_total: u32,
    pub tasks: u64,
    pub landed_first_try: u64,
    pub retries: u64,
    pub fix_tasks: u64,
    pub tokens: u64,
    pub wall_ms: u64,
    /// The largest prompt of a planner or Subplanner call, in bytes (from the journal).
    pub largest_prompt_bytes: u64,
    /// The most input tokens one planner or Subplanner call was charged, as the provider
    /// counted them (a call with tool rounds adds its rounds up): the request's real size.
    pub largest_call_tokens_in: u64,
    /// Where the run's repository is, to look at what was built.
    pub repo: PathBuf,
}

pub async fn run(
    client: &Client,
    dir: &Path,
    only: &[String],
    models: Models<'_>,
    planning: Planning,
    work: Option<&Path>,
    json: bool,
) -> Result<Exit, CliError> {
    let dir = std::fs::canonicalize(dir).map_err(|e| {
        CliError::user(format!("evaluation folder {}", dir.display()))
            .because(e)
            .hint("pass the folder that holds the projects (evals/ in flotilla's repository)")
    })?;
    let projects = projects(&dir, only)?;
    let work = match work {
        Some(work) => {
            std::fs::create_dir_all(work)
                .map_err(|e| CliError::user(format!("{}", work.display())).because(e))?;
            std::fs::canonicalize(work)
                .map_err(|e| CliError::user(format!("{}", work.display())).because(e))?
        }
        None => tempfile::Builder::new()
            .prefix("flotilla-eval-")
            .tempdir()
            .map_err(|e| CliError::internal("cannot make a work directory").because(e))?
            .keep(),
    };
    note(&format!(
        "evaluating {} project(s); repositories under {}",
        projects.len(),
        work.display()
    ));
    let mut rows = Vec::new();
    for (name, project) in projects {
        note(&format!("{name}: running"));
        let row = match evaluate(
            client,
            &name,
            &project,
            &models,
            planning,
            &work.join(&name),
        )
        .await
        {
            Ok(row) => row,
            Err(e) => EvalRow {
                project: name.clone(),
                outcome: format!("not run: {e}"),
                ..EvalRow::default()
            },
        };
        note(&format!(
            "{name}: {}, acceptance {}/{}",
            text_safety::terminal_safe(&row.outcome),
            row.acceptance_passed,
            row.acceptance_total
        ));
        if json {
            emit(&format!("{}\n", text_safety::json_line(&row)))?;
        }
        rows.push(row);
    }
    if !json {
        emit(&table(&rows))?;
    }
    let all_ran = rows.iter().all(|r| r.run.is_some());
    Ok(if all_ran { Exit::Ok } else { Exit::Failure })
}

/// The projects of `dir` (folders with an `eval.toml`), by name; `only` picks some.
fn projects(dir: &Path, only: &[String]) -> Result<Vec<(String, PathBuf)>, CliError> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| CliError::user(format!("{}", dir.display())).because(e))?;
    let mut found: Vec<(String, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter(|e| e.path().join("eval.toml").is_file())
        .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
        .collect();
    found.sort();
    for name in only {
        if !found.iter().any(|(n, _)| n == name) {
            return Err(CliError::user(format!(
                "no project {:?} in {}",
                text_safety::terminal_safe(name),
                dir.display()
            )));
        }
    }
    if !only.is_empty() {
        found.retain(|(n, _)| only.contains(n));
    }
    if found.is_empty() {
        return Err(CliError::user(format!(
            "{} holds no project (a folder with an eval.toml)",
            dir.display()
        )));
    }
    Ok(found)
}

async fn evaluate(
    client: &Client,
    name: &str,
    project: &Path,
    models: &Models<'_>,
    planning: Planning,
    work: &Path,
) -> Result<EvalRow, CliError> {
    let spec: EvalSpec = toml::from_str(&read(&project.join("eval.toml"))?)
        .map_err(|e| CliError::config(format!("{}/eval.toml", project.display())).because(e))?;
    if work.exists() {
        return Err(CliError::user(format!(
            "{} exists: give --work a fresh directory",
            work.display()
        )));
    }
    let repo = work.join("repo");
    copy_tree(&project.join("repo"), &repo)?;
    commit_all(&repo)?;
    let config_path = work.join("flotilla.toml");
    write_config(project, models, planning, &config_path)?;
    let config = RunConfig::load(&config_path).map_err(|e| {
        let hint = e.hint();
        CliError::wrap(ErrorKind::Config, e).hint(hint)
    })?;
    let created = client
        .submit(&CreateRun {
            request: spec.request.clone(),
            repo: repo.clone(),
            config: Some(config),
        })
        .await?;
    let events = match tokio::time::timeout(
        Duration::from_secs(spec.timeout_secs),
        events_to_end(client, &created.id),
    )
    .await
    {
        Ok(events) => Some(events?),
        Err(_) => {
            // The run goes on in the daemon; it is no use to the table any more.
            let cancelled: Result<serde_json::Value, _> = client
                .json(
                    hyper::Method::POST,
                    &format!("/v1/runs/{}/cancel", segment(&created.id)),
                    None::<&()>,
                )
                .await;
            if let Err(e) = cancelled {
                note(&format!(
                    "{name}: cannot cancel the run that timed out: {e}"
                ));
            }
            None
        }
    };
    let report = client.report(&created.id).await?;
    let (acceptance_passed, acceptance_total) =
        acceptance(project, &repo, &work.join("acceptance-run"), &spec).await?;
    Ok(row(
        name,
        &created.id,
        events.as_deref(),
        &report,
        (acceptance_passed, acceptance_total),
        repo,
    ))
}

/// Every event of the run, to its `run_finished`.
async fn events_to_end(client: &Client, run: &str) -> Result<Vec<Event>, CliError> {
    let mut stream = Box::pin(client.events(run, None).await?);
    let mut events = Vec::new();
    while let Some(event) = stream.next().await {
        let event = event?;
        let finished = matches!(event.kind, EventKind::RunFinished { .. });
        // Live notices (seq 0) are not part of the run's record.
        if event.seq != 0 {
            events.push(event);
        }
        if finished {
            break;
        }
    }
    Ok(events)
}

fn row(
    name: &str,
    run: &str,
    events: Option<&[Event]>,
    report: &RunReport,
    (acceptance_passed, acceptance_total): (u32, u32),
    repo: PathBuf,
) -> EvalRow {
    let events = events.unwrap_or_default();
    let largest_prompt_bytes = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::PlannerResponded { prompt, .. }
            | EventKind::SubplannerResponded { prompt, .. } => Some(prompt.len() as u64),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let largest_call_tokens_in = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::PlannerResponded { usage, .. }
            | EventKind::SubplannerResponded { usage, .. } => Some(usage.tokens_in),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let wall_ms = match (events.first(), events.last()) {
        (Some(first), Some(last)) => last.at_ms.saturating_sub(first.at_ms),
        _ => 0,
    };
    let outcome = if events.is_empty() {
        "timed out".to_string()
    } else {
        report.state.clone()
    };
    EvalRow {
        project: name.to_string(),
        run: Some(run.to_string()),
        outcome,
        acceptance_passed,
        acceptance_total,
        tasks: report.tasks.total,
        landed_first_try: report.tasks.completed_first_try,
        retries: report.tasks.retries,
        fix_tasks: report.tasks.fix_tasks,
        tokens: report.spent.tokens,
        wall_ms,
        largest_prompt_bytes,
        largest_call_tokens_in,
        repo,
    }
}

/// Runs the acceptance tests on main's tip: `(passed, total)`.
async fn acceptance(
    project: &Path,
    repo: &Path,
    at: &Path,
    spec: &EvalSpec,
) -> Result<(u32, u32), CliError> {
    let failed = |what: &str, e: git2::Error| {
        CliError::internal(format!("acceptance: cannot {what}")).because(e)
    };
    let source = repo
        .to_str()
        .ok_or_else(|| CliError::internal("the repository's path is not UTF-8"))?;
    git2::build::RepoBuilder::new()
        .branch("main")
        .clone(source, at)
        .map_err(|e| failed("clone main", e))?;
    copy_tree(&project.join("acceptance"), &at.join("acceptance"))?;
    // Sandboxed like every command run on a task's behalf: the code is the agents'.
    let runner = ConfinedRunner::new(SandboxPolicy::for_run(&SandboxConfig::default(), &[], repo));
    let mut command = CommandSpec::shell(spec.acceptance.clone(), at);
    command.limits.wall = ACCEPTANCE_LIMIT;
    let output = runner
        .run(command, CancellationToken::new(), None)
        .await
        .map_err(|e| CliError::internal("acceptance: cannot run the tests").because(e))?;
    let passed = passed_tests(&output.stdout.text).min(spec.tests);
    if output.exit != (CommandExit::Code { code: 0 }) && passed == spec.tests {
        // Every test said ok and the command still failed: trust the failure.
        return Ok((passed.saturating_sub(1), spec.tests));
    }
    Ok((passed, spec.tests))
}

/// How many lines say `ok` (TAP: `ok 3 - name`, or `ok - name`).
fn passed_tests(stdout: &str) -> u32 {
    let count = stdout
        .lines()
        .filter(|l| *l == "ok" || l.starts_with("ok ") || l.starts_with("ok\t"))
        .count();
    u32::try_from(count).unwrap_or(u32::MAX)
}

/// The run's config: the project's `flotilla.toml`, its models as `models` and `planning`
/// say, and the project's folder hidden from every command of the run.
fn write_config(
    project: &Path,
    models: &Models<'_>,
    planning: Planning,
    to: &Path,
) -> Result<(), CliError> {
    let bad = |path: &Path, e: toml::de::Error| {
        CliError::config(format!("{}", path.display())).because(e)
    };
    let own = project.join("repo").join("flotilla.toml");
    let mut config: toml::Table = read(&own)?.parse().map_err(|e| bad(&own, e))?;
    match models {
        Models::Project => {}
        Models::From(file) => {
            let given: toml::Table = read(file)?.parse().map_err(|e| bad(file, e))?;
            for table in ["providers", "roles", "prices"] {
                config.remove(table);
                if let Some(value) = given.get(table) {
                    config.insert(table.into(), value.clone());
                }
            }
        }
        Models::Scripted => {
            for table in ["providers", "roles", "prices", "agents", "workers"] {
                config.remove(table);
            }
        }
    }
    if matches!(models, Models::Scripted) || planning == Planning::Scripted {
        // A role `[roles]` leaves out goes to the scenario (ProviderRegistry::llm_for).
        if let Some(roles) = config.get_mut("roles").and_then(toml::Value::as_table_mut) {
            roles.remove("planner");
            roles.remove("subplanner");
        }
        let scenario = project.join("scripted.toml");
        let mut provider = toml::Table::new();
        provider.insert("kind".into(), "scripted".into());
        provider.insert("scenario".into(), scenario.display().to_string().into());
        config.insert("provider".into(), provider.into());
    }
    let sandbox = config
        .entry("sandbox")
        .or_insert_with(|| toml::Table::new().into());
    let Some(sandbox) = sandbox.as_table_mut() else {
        return Err(CliError::config(format!(
            "{}: [sandbox] must be a table for an evaluation",
            own.display()
        )));
    };
    let hidden = sandbox
        .entry("hidden")
        .or_insert_with(|| toml::Value::Array(Vec::new()));
    if let Some(hidden) = hidden.as_array_mut() {
        hidden.push(project.display().to_string().into());
    }
    let text = toml::to_string(&config)
        .map_err(|e| CliError::internal("cannot write the run's config").because(e))?;
    std::fs::write(to, text)
        .map_err(|e| CliError::internal(format!("cannot write {}", to.display())).because(e))
}

fn read(path: &Path) -> Result<String, CliError> {
    crate::text_file::read(path).map_err(|e| CliError::wrap(ErrorKind::Config, e))
}

/// Copies the regular files and folders of `from` to `to`; a link is refused (a project
/// that points outside itself would leak what it points at into the run).
fn copy_tree(from: &Path, to: &Path) -> Result<(), CliError> {
    let io = |path: &Path, e: std::io::Error| {
        CliError::internal(format!("cannot copy {}", path.display())).because(e)
    };
    std::fs::create_dir_all(to).map_err(|e| io(to, e))?;
    for entry in std::fs::read_dir(from).map_err(|e| io(from, e))? {
        let entry = entry.map_err(|e| io(from, e))?;
        let kind = entry.file_type().map_err(|e| io(&entry.path(), e))?;
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target).map_err(|e| io(&entry.path(), e))?;
        } else {
            return Err(CliError::user(format!(
                "{} is a link or a special file: an evaluation project holds plain files",
                entry.path().display()
            )));
        }
    }
    Ok(())
}

/// `git init -b main` and one commit of everything, as the user would start.
fn commit_all(repo: &Path) -> Result<(), CliError> {
    let failed = |e: git2::Error| {
        CliError::internal(format!("cannot make the repository {}", repo.display())).because(e)
    };
    let mut options = git2::RepositoryInitOptions::new();
    options.initial_head("main");
    let git = git2::Repository::init_opts(repo, &options).map_err(failed)?;
    let mut index = git.index().map_err(failed)?;
    index
        .add_all(["*"], git2::IndexAddOption::DEFAULT, None)
        .map_err(failed)?;
    index.write().map_err(failed)?;
    let tree = git
        .find_tree(index.write_tree().map_err(failed)?)
        .map_err(failed)?;
    let who = git2::Signature::now("flotilla eval", "eval@flotilla.invalid").map_err(failed)?;
    git.commit(
        Some("HEAD"),
        &who,
        &who,
        "the project as the user starts it",
        &tree,
        &[],
    )
    .map_err(failed)?;
    Ok(())
}

/// The table, with a total row.
pub fn table(rows: &[EvalRow]) -> String {
    let mut total = EvalRow {
        project: "total".into(),
        ..EvalRow::default()
    };
    for row in rows {
        total.acceptance_passed = total
            .acceptance_passed
            .saturating_add(row.acceptance_passed);
        total.acceptance_total = total.acceptance_total.saturating_add(row.acceptance_total);
        total.tasks = total.tasks.saturating_add(row.tasks);
        total.landed_first_try = total.landed_first_try.saturating_add(row.landed_first_try);
        total.retries = total.retries.saturating_add(row.retries);
        total.fix_tasks = total.fix_tasks.saturating_add(row.fix_tasks);
        total.tokens = total.tokens.saturating_add(row.tokens);
        total.wall_ms = total.wall_ms.saturating_add(row.wall_ms);
        total.largest_prompt_bytes = total.largest_prompt_bytes.max(row.largest_prompt_bytes);
        total.largest_call_tokens_in = total.largest_call_tokens_in.max(row.largest_call_tokens_in);
    }
    let line = |r: &EvalRow, outcome: &str| {
        format!(
            "{:<14} {:<10} {:>10} {:>5} {:>9} {:>7} {:>5} {:>9} {:>8} {:>14} {:>10}\n",
            text_safety::terminal_safe(&r.project),
            outcome,
            format!("{}/{}", r.acceptance_passed, r.acceptance_total),
            r.tasks,
            r.landed_first_try,
            r.retries,
            r.fix_tasks,
            r.tokens,
            format!("{:.1} s", r.wall_ms as f64 / 1000.0),
            r.largest_prompt_bytes,
            r.largest_call_tokens_in,
        )
    };
    let mut out = format!(
        "{:<14} {:<10} {:>10} {:>5} {:>9} {:>7} {:>5} {:>9} {:>8} {:>14} {:>10}\n",
        "project",
        "outcome",
        "acceptance",
        "tasks",
        "first try",
        "retries",
        "fixes",
        "tokens",
        "wall",
        "largest prompt",
        "planner in",
    );
    for row in rows {
        let outcome: String = text_safety::terminal_safe(&row.outcome)
            .chars()
            .take(10)
            .collect();
        out.push_str(&line(row, &outcome));
    }
    out.push_str(&line(&total, ""));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_ok_lines_count_as_passed() {
        let out = "ok 1 - adds\nnot ok 2 - divides\nok - parses\nok\n# ok in a comment\nokay\n";
        assert_eq!(passed_tests(out), 3);
    }

    /// `--scripted-plan`: the scenario plans, the project's model still works; with
    /// `--scripted` the scenario plays every role.
    #[test]
    fn a_scripted_plan_keeps_the_workers_model_and_drops_only_the_planners() {
        use flotilla_actors::ports::Role;
        let project = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("evals/calc-py");
        let dir = tempfile::tempdir().unwrap();
        let load = |models: Models<'_>, planning: Planning| {
            let to = dir.path().join("flotilla.toml");
            write_config(&project, &models, planning, &to).unwrap();
            RunConfig::load(&to).unwrap()
        };
        let mixed = load(Models::Project, Planning::Scripted);
        let roles = &mixed.models.roles;
        assert!(roles.get(Role::Planner).is_none());
        assert!(roles.get(Role::Subplanner).is_none());
        let worker = roles.get(Role::Worker).expect("the worker keeps its model");
        assert_eq!(worker.names(), ["local/smollm2-tools".to_string()]);
        assert!(mixed.models.providers.contains_key("local"));
        assert!(
            !mixed.scenario.planner.answers.is_empty(),
            "the scenario plans"
        );

        let own = load(Models::Project, Planning::Models);
        assert!(own.models.roles.get(Role::Planner).is_some());

        let scripted = load(Models::Scripted, Planning::Models);
        assert!(scripted.models.roles.get(Role::Worker).is_none());
        assert!(scripted.models.providers.is_empty());
    }

    #[test]
    fn the_total_row_adds_up_and_saturates() {
        let row = |tokens| EvalRow {
            project: "p".into(),
            acceptance_passed: 2,
            acceptance_total: 3,
            tokens,
            largest_prompt_bytes: tokens,
            largest_call_tokens_in: tokens,
            ..EvalRow::default()
        };
        let text = table(&[row(u64::MAX), row(5)]);
        let total = text.lines().last().unwrap();
        assert!(total.starts_with("total"), "{text}");
        assert!(total.contains("4/6"), "{text}");
        assert!(total.contains(&u64::MAX.to_string()), "{text}");
    }
}
