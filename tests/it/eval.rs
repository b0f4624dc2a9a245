//! `flotilla eval` through the built binary and a real daemon: the projects of `evals/`
//! solved by their scripted solutions pass every acceptance test, a wrong solution is
//! counted as failing, and no agent of a run can read a project's acceptance tests.

use std::path::Path;

use crate::daemon_env::{DaemonProcess, flotilla};

fn rows(stdout: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn the_scripted_solutions_of_every_evaluation_pass_their_acceptance_tests() {
    let state = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let _daemon = DaemonProcess::start(state.path());
    let evals = Path::new(env!("CARGO_MANIFEST_DIR")).join("evals");
    let out = flotilla(state.path())
        .arg("eval")
        .arg(&evals)
        .args(["--scripted", "--json", "--work"])
        .arg(work.path().join("runs"))
        .timeout(std::time::Duration::from_secs(600))
        .assert()
        .success();
    let rows = rows(&out.get_output().stdout);
    let names: Vec<&str> = rows
        .iter()
        .map(|r| r["project"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["calc-py", "slug-js", "strutil-rs"]);
    for row in &rows {
        assert_eq!(row["outcome"], "completed", "{row}");
        assert!(row["acceptance_total"].as_u64().unwrap() >= 5, "{row}");
        assert_eq!(row["acceptance_passed"], row["acceptance_total"], "{row}");
        assert_eq!(row["landed_first_try"], row["tasks"], "{row}");
        assert!(row["tokens"].as_u64().unwrap() > 0, "{row}");
        assert!(row["largest_prompt_bytes"].as_u64().unwrap() > 0, "{row}");
        let tokens_in = row["largest_call_tokens_in"].as_u64().unwrap();
        assert!(tokens_in > 0, "{row}");
        // The repository is kept, with the work on main.
        let repo = Path::new(row["repo"].as_str().unwrap());
        assert!(repo.join(".git").is_dir(), "{row}");
    }
}

#[test]
fn a_wrong_solution_fails_its_tests_and_no_agent_reads_them() {
    // Not under /tmp, which every sandbox hides anyway: here only `[sandbox] hidden` can
    // keep the tests from the agents.
    let evals = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let project = evals.path().join("wrong-answer");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/evals/wrong-answer");
    for dir in ["", "repo", "acceptance"] {
        std::fs::create_dir_all(project.join(dir)).unwrap();
        for entry in std::fs::read_dir(fixture.join(dir)).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_file() {
                let text = std::fs::read_to_string(entry.path()).unwrap();
                let text = text.replace("PROJECT", &project.display().to_string());
                std::fs::write(project.join(dir).join(entry.file_name()), text).unwrap();
            }
        }
    }
    // The agent's command would see the tests without the hiding.
    assert!(project.join("acceptance/test.sh").is_file());
    let state = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let _daemon = DaemonProcess::start(state.path());
    let out = flotilla(state.path())
        .arg("eval")
        .arg(evals.path())
        .args(["--scripted", "--json", "--work"])
        .arg(work.path().join("runs"))
        .timeout(std::time::Duration::from_secs(300))
        .assert()
        .success();
    let rows = rows(&out.get_output().stdout);
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    assert_eq!(row["outcome"], "completed", "{row}");
    assert_eq!(
        (
            row["acceptance_passed"].as_u64(),
            row["acceptance_total"].as_u64()
        ),
        (Some(1), Some(3)),
        "one of three: the third printed no line at all {row}"
    );
    let repo = Path::new(row["repo"].as_str().unwrap());
    let peek = std::fs::read_to_string(repo.join("peek.txt")).unwrap();
    assert!(
        !peek.contains("test.sh"),
        "the agent read the tests: {peek}"
    );
    assert!(peek.contains("No such file or directory"), "{peek}");
    // The run's config hides the project's folder.
    let config =
        std::fs::read_to_string(work.path().join("runs/wrong-answer/flotilla.toml")).unwrap();
    assert!(config.contains("hidden"), "{config}");
    assert!(config.contains(&project.display().to_string()), "{config}");
}

#[test]
fn an_unknown_project_or_an_empty_folder_is_a_clear_error() {
    let state = tempfile::tempdir().unwrap();
    let empty = tempfile::tempdir().unwrap();
    let out = flotilla(state.path())
        .arg("eval")
        .arg(empty.path())
        .assert()
        .code(2);
    let stderr = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(stderr.contains("holds no project"), "{stderr}");
    let evals = Path::new(env!("CARGO_MANIFEST_DIR")).join("evals");
    let out = flotilla(state.path())
        .arg("eval")
        .arg(&evals)
        .args(["--project", "nonesuch"])
        .assert()
        .code(2);
    let stderr = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(stderr.contains("no project \"nonesuch\""), "{stderr}");
}

/// `--scripted-plan`: the project's scenario plans and the workers call the model. With
/// the planner role also on the fake model (whose tool-call answers no planner could
/// use), the run still gets the scenario's two tasks, and only workers reach the model.
#[tokio::test]
async fn a_scripted_plan_plans_from_the_scenario_and_sends_only_the_workers_to_the_model() {
    use crate::daemon_env::{fake_worker_model, tool_call, tool_calls_answer};
    let finish = || {
        tool_calls_answer(
            Some(""),
            serde_json::json!([tool_call(
                "f",
                "finish",
                serde_json::json!({ "status": "complete", "summary": "done" })
            )]),
        )
    };
    let server = fake_worker_model(finish(), finish()).await;
    let state = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let models = work.path().join("models.toml");
    std::fs::write(
        &models,
        format!(
            "[providers.local]\nkind = \"openai\"\nbase_url = \"{}/v1\"\nstream = false\n\n\
             [roles]\nplanner = \"local/m\"\nsubplanner = \"local/m\"\nworker = \"local/m\"\n",
            server.uri()
        ),
    )
    .unwrap();
    let _daemon = DaemonProcess::start(state.path());
    let evals = Path::new(env!("CARGO_MANIFEST_DIR")).join("evals");
    let runs = work.path().join("runs");
    let state_dir = state.path().to_path_buf();
    let out = tokio::task::spawn_blocking(move || {
        flotilla(&state_dir)
            .arg("eval")
            .arg(&evals)
            .args([
                "--scripted-plan",
                "--project",
                "calc-py",
                "--json",
                "--models",
            ])
            .arg(&models)
            .arg("--work")
            .arg(&runs)
            .timeout(std::time::Duration::from_secs(600))
            .assert()
            .success()
            .get_output()
            .stdout
            .clone()
    })
    .await
    .unwrap();
    let rows = rows(&out);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["tasks"], 2, "the scenario's plan: {}", rows[0]);
    let requests = server.received_requests().await.unwrap();
    assert!(!requests.is_empty(), "no worker called the model");
    for request in &requests {
        let body = String::from_utf8_lossy(&request.body);
        assert!(
            !body.contains("product specification: binding"),
            "a planner's request reached the model: {}",
            &body[..body.len().min(400)]
        );
    }
}
