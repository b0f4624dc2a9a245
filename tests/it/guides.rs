//! The guides in `docs/` are checked against the code, so that they cannot rot: every event
//! kind and field is in `docs/events.md`; every config block of `docs/providers.md` and
//! `docs/agents.md` loads as `submit` would load it, and is then used for real: its
//! provider answers `providers check` (a local server speaking that provider's wire
//! format) and its agent preset runs a task against a fake of its CLI.

use std::collections::BTreeMap;
use std::path::Path;

use flotilla_actors::protocol::{Event, EventKind, TaskId};

fn guide(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("docs")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The guide's `### `name`` sections: heading name → the text up to the next heading.
fn sections(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    for line in text.lines() {
        if line.starts_with('#') {
            if let Some((name, body)) = current.take() {
                out.insert(name, body);
            }
            if let Some(name) = line
                .strip_prefix("### `")
                .and_then(|rest| rest.strip_suffix('`'))
            {
                current = Some((name.to_string(), String::new()));
            }
        } else if let Some((_, body)) = current.as_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    if let Some((name, body)) = current {
        out.insert(name, body);
    }
    out
}

#[test]
fn every_event_kind_and_each_of_its_fields_is_in_the_events_guide() {
    let text = guide("events.md");
    let documented = sections(&text);
    let samples = EventKind::samples(&TaskId::root(1));
    let mut missing = Vec::new();
    for kind in &samples {
        let name = kind.name();
        let Some(body) = documented.get(name) else {
            missing.push(format!("no section `### `{name}``"));
            continue;
        };
        let json = serde_json::to_value(kind).unwrap();
        if let Some(data) = json.get("data").and_then(|d| d.as_object()) {
            for field in data.keys() {
                if !body.contains(&format!("`{field}`")) {
                    missing.push(format!("{name}: field `{field}` is not described"));
                }
            }
        }
    }
    let kinds: Vec<&str> = samples.iter().map(EventKind::name).collect();
    for name in documented.keys() {
        if !kinds.contains(&name.as_str()) {
            missing.push(format!("`{name}` is described but is no event kind"));
        }
    }
    assert!(
        missing.is_empty(),
        "docs/events.md:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_events_guides_example_is_an_event_as_the_stream_sends_it() {
    let text = guide("events.md");
    let example = text
        .split("```json\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .expect("a json example")
        .to_string();
    let event: Result<Event, _> = serde_json::from_str(&example);
    let event = event.unwrap_or_else(|e| panic!("{e}: {example}"));
    assert_eq!(event.kind.name(), "task_added");
}

/// Every ```toml block of a guide: each is a whole `flotilla.toml`.
fn toml_blocks(text: &str) -> Vec<String> {
    text.split("```toml\n")
        .skip(1)
        .map(|rest| rest.split("```").next().unwrap_or_default().to_string())
        .collect()
}

fn flotilla() -> assert_cmd::Command {
    let mut cmd = assert_cmd::Command::cargo_bin("flotilla").unwrap();
    cmd.env("NO_COLOR", "1").env_remove("FLOTILLA_SOCKET");
    cmd
}

#[test]
fn every_config_of_the_provider_and_agent_guides_loads_as_submit_loads_it() {
    for name in ["providers.md", "agents.md"] {
        let blocks = toml_blocks(&guide(name));
        assert!(blocks.len() >= 3, "{name} has {} configs", blocks.len());
        for (i, block) in blocks.iter().enumerate() {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("flotilla.toml");
            std::fs::write(&path, block).unwrap();
            let out = flotilla()
                .args(["config", "check"])
                .arg(&path)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "docs/{name}, config {}: {}\n{block}",
                i + 1,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// Each provider config of `docs/providers.md`, pointed at a local server that speaks its
/// wire format (streamed, as flotilla asks by default), passes `providers check`: every
/// model answers, and the key the config names reaches the server in that format's header.
#[tokio::test]
async fn every_provider_config_of_the_guide_answers_providers_check() {
    use crate::providers::{Format, sse, streamed_text};
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer};

    const KEY: &str = "guide-test-key-0123";
    let server = MockServer::start().await;
    for (i, block) in toml_blocks(&guide("providers.md")).iter().enumerate() {
        let mut config: toml::Table = block.parse().unwrap();
        let mut keys = Vec::new();
        let providers = config["providers"].as_table_mut().unwrap();
        for (_, provider) in providers.iter_mut() {
            let provider = provider.as_table_mut().unwrap();
            let format = match provider["kind"].as_str().unwrap() {
                "openai" => Format::OpenAi,
                "anthropic" => Format::Anthropic,
                other => panic!("kind {other}"),
            };
            let base = match format {
                Format::OpenAi => format!("{}/v1", server.uri()),
                Format::Anthropic => server.uri(),
            };
            provider.insert("base_url".into(), base.into());
            if let Some(key) = provider.get("api_key_env") {
                keys.push(key.as_str().unwrap().to_string());
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("flotilla.toml");
        std::fs::write(&file, toml::to_string(&config).unwrap()).unwrap();
        server.reset().await;
        for format in [Format::OpenAi, Format::Anthropic] {
            Mock::given(method("POST"))
                .and(path(format.path()))
                .respond_with(sse(streamed_text(format, &["ok"], Some((9, 1)))))
                .mount(&server)
                .await;
        }
        let mut cmd = flotilla();
        cmd.args(["providers", "check", "--timeout", "30", "--config"])
            .arg(&file);
        for key in &keys {
            cmd.env(key, KEY);
        }
        // The binary blocks; the mock server answers on this test's runtime meanwhile.
        let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "docs/providers.md, config {}: {stdout}{}",
            i + 1,
            String::from_utf8_lossy(&out.stderr)
        );
        // One line and one call per model of each role (a list is every model of it).
        let models: usize = config["roles"]
            .as_table()
            .unwrap()
            .values()
            .map(|m| m.as_array().map_or(1, Vec::len))
            .sum();
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines.len(), models, "{stdout}");
        assert!(lines.iter().all(|l| l.contains(" reachable ")), "{stdout}");
        assert!(!stdout.contains(KEY), "{stdout}");
        let requests = server.received_requests().await.unwrap();
        assert_eq!(requests.len(), models, "one call per model, no retries");
        for request in requests {
            let header = |name: &str| {
                request
                    .headers
                    .get(name)
                    .map(|v| v.to_str().unwrap().to_string())
            };
            if request.url.path() == Format::Anthropic.path() {
                assert_eq!(header("x-api-key").as_deref(), Some(KEY));
            } else if let Some(bearer) = header("authorization") {
                assert_eq!(bearer, format!("Bearer {KEY}"));
            } else {
                // Sent without a key: only a keyless provider's call may be.
                assert!(
                    providers_without_key(&config),
                    "config {}: a call went out without its key",
                    i + 1
                );
            }
        }
    }
}

/// Whether some OpenAI-format provider of `config` names no key.
fn providers_without_key(config: &toml::Table) -> bool {
    config["providers"]
        .as_table()
        .unwrap()
        .values()
        .any(|p| p.get("api_key_env").is_none() && p["kind"].as_str() == Some("openai"))
}

/// Each agent config of `docs/agents.md` runs a task in a real worktree against a fake of
/// its CLI (which refuses arguments the real one would refuse, or that would leave it
/// unable to edit): the task completes with what git says, and none of flotilla's files
/// reach the branch.
#[actix::test]
async fn every_agent_config_of_the_guide_runs_a_task_against_a_fake_of_its_cli() {
    use crate::command_agent::{FIXTURES, completed, no_flotilla_files, start};
    use flotilla::agents::command::Preset;
    use flotilla_actors::protocol::HandoffStatus;

    let mut ran = Vec::new();
    for (i, block) in toml_blocks(&guide("agents.md")).iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flotilla.toml");
        std::fs::write(&path, block).unwrap();
        let config = flotilla::config::RunConfig::load(&path).unwrap();
        assert!(!config.agents.is_empty(), "config {} names no agent", i + 1);
        for (name, agent) in &config.agents {
            let fake = match agent.preset {
                Some(Preset::ClaudeCode) => "fake-claude",
                Some(Preset::Codex) => "fake-codex",
                Some(Preset::Aider) => "fake-aider",
                None => panic!("[agents.{name}] has no preset"),
            };
            let mut agent = agent.clone();
            agent.program = Some(format!("{FIXTURES}/{fake}"));
            let mut session = start(agent);
            let branch = session.assign("t1", &["src"]);
            let (outcome, _) = session.outcome().await;
            let handoff = completed(outcome).handoff.unwrap();
            assert_eq!(
                handoff.status,
                HandoffStatus::Complete,
                "docs/agents.md, config {}: {}",
                i + 1,
                handoff.summary
            );
            no_flotilla_files(&session.paths_on(&branch));
            ran.push(fake);
        }
    }
    ran.sort_unstable();
    ran.dedup();
    assert_eq!(ran, ["fake-aider", "fake-claude", "fake-codex"]);
}
