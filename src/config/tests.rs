use super::*;
use crate::text_file::MAX_FILE_BYTES;

#[test]
fn loads_a_config_and_its_scenario() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("s.toml"),
        "[[planner.answers]]\ntasks = []\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("flotilla.toml"),
        "[provider]\nscenario = \"s.toml\"\n[limits]\nmax_workers = 2\n",
    )
    .unwrap();
    let config = RunConfig::load(&dir.path().join("flotilla.toml")).unwrap();
    assert_eq!(config.limits.max_workers, 2);
    assert_eq!(config.scenario.planner.answers.len(), 1);
}

#[test]
fn unknown_keys_and_missing_scenarios_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flotilla.toml");
    std::fs::write(&path, "[limits]\nmax_wrokers = 2\n").unwrap();
    let err = RunConfig::load(&path).unwrap_err().to_string();
    assert!(err.contains("max_wrokers"), "{err}");
    std::fs::write(&path, "[limits]\n").unwrap();
    assert!(matches!(
        RunConfig::load(&path),
        Err(ConfigError::NoScenario { .. })
    ));
}

/// A config whose every part has a model or an agent needs no scenario; one that leaves a
/// part to the scripted provider says which part.
#[test]
fn a_scenario_is_needed_only_for_what_is_scripted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flotilla.toml");
    let models = "[providers.local]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:8080/v1\"\n";
    let load = |rest: &str| {
        std::fs::write(&path, format!("{models}{rest}")).unwrap();
        RunConfig::load(&path)
    };
    let all = "[roles]\nplanner = \"local/m\"\nsubplanner = \"local/m\"\nworker = \"local/m\"\n";
    let config = load(all).unwrap();
    assert_eq!(config.scripted_part(), None);
    assert_eq!(config.scenario, Scenario::default());
    assert_eq!(
        config.sources.len(),
        1,
        "no scenario file: {:?}",
        config.sources
    );

    let scripted_worker = format!("{all}[[workers]]\nname = \"replay\"\nagent = \"scripted\"\n");
    let err = load(&scripted_worker).unwrap_err();
    assert!(
        matches!(&err, ConfigError::NoScenario { scripted, .. } if scripted == "worker profile \"replay\""),
        "{err}"
    );
    let err = load("[roles]\nplanner = \"local/m\"\nworker = \"local/m\"\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("the subplanner role is scripted"), "{err}");
    let err = load("[roles]\nsubplanner = \"local/m\"\nworker = \"local/m\"\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("the planner role is scripted"), "{err}");
    let err = load("[roles]\nplanner = \"local/m\"\nsubplanner = \"local/m\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("worker profile \"general\" is scripted"),
        "{err}"
    );
}

#[test]
fn worker_profiles_name_agents_that_exist_and_agent_tables_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.toml"), "").unwrap();
    let path = dir.path().join("flotilla.toml");
    let load = |rest: &str| {
        std::fs::write(&path, format!("[provider]\nscenario = \"s.toml\"\n{rest}")).unwrap();
        RunConfig::load(&path)
    };
    let ok = load(
        "[agents.claude]\npreset = \"claude-code\"\n[[workers]]\nname = \"a\"\nagent = \"claude\"\n[[workers]]\nname = \"b\"\nagent = \"builtin\"\n\
         [providers.local]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:1/v1\"\n[roles]\nworker = \"local/m\"\n",
    )
    .unwrap();
    assert_eq!(ok.agents.len(), 1);
    let err = load("[[workers]]\nname = \"a\"\nagent = \"cluade\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("\"cluade\"") && err.contains("[agents.NAME]"),
        "{err}"
    );
    let err = load("[agents.builtin]\nprogram = \"x\"\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("built-in agent kind"), "{err}");
    let err = load("[agents.cli]\nargs = [\"-p\"]\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("[agents.cli]"), "{err}");
    let err = load("[[workers]]\nname = \"a\"\nagnet = \"builtin\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("agnet"),
        "a typo in a profile is refused: {err}"
    );
    let err = load("[builtin_agent]\nmax_tool_calls = 0\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("max_tool_calls"), "{err}");
}

/// A project whose scenario path is `scenario`.
fn project(scenario: &Path) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flotilla.toml");
    std::fs::write(
        &path,
        format!(
            "[provider]\nscenario = {:?}\n",
            scenario.display().to_string()
        ),
    )
    .unwrap();
    (dir, path)
}

#[test]
fn devices_fifos_and_directories_are_refused_unread() {
    let (_dir, path) = project(Path::new("/dev/zero"));
    assert!(
        matches!(
            RunConfig::load(&path),
            Err(ConfigError::File(FileError::NotAFile { .. }))
        ),
        "/dev/zero would be read forever"
    );
    let fifo_dir = tempfile::tempdir().unwrap();
    let fifo = fifo_dir.path().join("scenario.toml");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let (_dir, path) = project(&fifo);
    // Unchecked, this blocks forever in open(): nobody writes the FIFO. A thread and a
    // generous bound turn that into a failure instead of a hung test.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(matches!(
            RunConfig::load(&path),
            Err(ConfigError::File(FileError::NotAFile { .. }))
        ));
    });
    assert_eq!(
        rx.recv_timeout(std::time::Duration::from_secs(30)),
        Ok(true),
        "a FIFO must be refused, not waited on"
    );
    let (_dir, path) = project(fifo_dir.path());
    assert!(matches!(
        RunConfig::load(&path),
        Err(ConfigError::File(FileError::NotAFile { .. }))
    ));
}

#[test]
fn files_over_the_cap_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.toml");
    let line = "# padding padding padding padding padding padding padding padding\n";
    std::fs::write(&big, line.repeat(MAX_FILE_BYTES as usize / line.len() + 1)).unwrap();
    let (_dir, path) = project(&big);
    assert!(matches!(
        RunConfig::load(&path),
        Err(ConfigError::File(FileError::TooLarge { .. }))
    ));
    std::fs::write(&big, line.repeat(MAX_FILE_BYTES as usize / line.len() - 1)).unwrap();
    assert!(RunConfig::load(&path).is_ok());
}

#[test]
fn errors_name_the_position_and_problem_never_the_text() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("shadow");
    for text in [
        "root:$6$s3cr3tHash:19000:0:99999:7:::\n",
        "[limits]\nmax_workers = \"s3cr3tHash\"\n",
        "[agent]\noutcome = \"s3cr3tHash\"\n",
        "[[planner.answers]]\ndelay_ms = [\"s3cr3tHash\"]\n",
    ] {
        std::fs::write(&secret, text).unwrap();
        for path in [secret.clone(), project(&secret).1] {
            let err = RunConfig::load(&path).unwrap_err().to_string();
            assert!(!err.contains("s3cr3t"), "{err}");
            assert!(err.contains("shadow"), "names the file: {err}");
            assert!(err.contains("line "), "names the line: {err}");
        }
    }
}

#[test]
fn unknown_scenario_keys_are_refused_with_the_key_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("s.toml");
    std::fs::write(
        &scenario,
        "[agent]\ndelay_ms = 1\n\n[tasks.t1]\noutcom = \"blocked\"\n",
    )
    .unwrap();
    let (_dir, path) = project(&scenario);
    let err = RunConfig::load(&path).unwrap_err().to_string();
    assert!(err.contains("outcom") && err.contains("line 5"), "{err}");
    // The old docs' `[tasks.t1.2]` is a table `2` inside t1, not task t1.2.
    std::fs::write(&scenario, "[tasks.t1.2]\ndelay_ms = 5000\n").unwrap();
    let err = RunConfig::load(&path).unwrap_err().to_string();
    assert!(err.contains("`2`") && err.contains("line 1"), "{err}");
    std::fs::write(&scenario, "[tasks.\"t1.2\"]\ndelay_ms = 5000\n").unwrap();
    let config = RunConfig::load(&path).unwrap();
    assert_eq!(config.scenario.tasks["t1.2"].step.delay_ms, Some(5000));
}

#[test]
fn the_builtin_agent_without_a_worker_model_is_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.toml"), "").unwrap();
    let path = dir.path().join("flotilla.toml");
    let profile = "[[workers]]\nname = \"coder\"\nagent = \"builtin\"\n";
    std::fs::write(
        &path,
        format!("[provider]\nscenario = \"s.toml\"\n{profile}"),
    )
    .unwrap();
    let err = RunConfig::load(&path).unwrap_err();
    assert!(
        matches!(
            &err,
            ConfigError::Run {
                source: RunConfigError::BuiltinWithoutWorkerModel { profile },
                ..
            } if profile == "coder"
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("[roles]"),
        "the fix is named: {err}"
    );
    // With a worker model it loads.
    std::fs::write(
        &path,
        format!(
            "[provider]\nscenario = \"s.toml\"\n{profile}\
             [providers.local]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:1/v1\"\n\
             [roles]\nworker = \"local/m\"\n"
        ),
    )
    .unwrap();
    RunConfig::load(&path).unwrap();
}

#[test]
fn impossible_limits_are_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.toml"), "").unwrap();
    let path = dir.path().join("flotilla.toml");
    for (limit, field) in [
        ("max_workers = 0", "max_workers"),
        ("max_nodes = 0", "max_nodes"),
    ] {
        std::fs::write(
            &path,
            format!("[provider]\nscenario = \"s.toml\"\n[limits]\n{limit}\n"),
        )
        .unwrap();
        let err = RunConfig::load(&path).unwrap_err();
        assert!(matches!(err, ConfigError::Limits { .. }), "{err}");
        assert!(err.to_string().contains(field), "{err}");
    }
}

#[test]
fn a_prompts_dir_overrides_prompts_and_a_bad_placeholder_is_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.toml"), "").unwrap();
    std::fs::create_dir(dir.path().join("mine")).unwrap();
    std::fs::write(
        dir.path().join("mine/root-planner.md"),
        "Plan at most {{max_subtasks}} things.",
    )
    .unwrap();
    let path = dir.path().join("flotilla.toml");
    std::fs::write(
        &path,
        "prompts_dir = \"mine\"\n[provider]\nscenario = \"s.toml\"\n",
    )
    .unwrap();
    let config = RunConfig::load(&path).unwrap();
    assert_eq!(
        crate::prompts::for_role(
            flotilla_actors::protocol::Role::Planner,
            &config.prompts,
            &config.limits
        ),
        "Plan at most 10 things."
    );
    config.validate().unwrap();
    std::fs::write(dir.path().join("mine/root-planner.md"), "{{max_subtask}}").unwrap();
    let err = RunConfig::load(&path).unwrap_err();
    assert!(matches!(err, ConfigError::Prompt { .. }), "{err}");
    assert!(err.to_string().contains("max_subtask"), "{err}");
}

#[test]
fn impossible_planner_settings_are_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.toml"), "").unwrap();
    let path = dir.path().join("flotilla.toml");
    for (setting, field) in [
        ("max_iterations = 0", "max_iterations"),
        ("max_consecutive_errors = 0", "max_consecutive_errors"),
        ("max_answer_bytes = 100", "max_answer_bytes"),
        ("backoff_base_ms = 10\nbackoff_max_ms = 5", "backoff_max_ms"),
    ] {
        std::fs::write(
            &path,
            format!("[provider]\nscenario = \"s.toml\"\n[planner]\n{setting}\n"),
        )
        .unwrap();
        let err = RunConfig::load(&path).unwrap_err();
        assert!(matches!(err, ConfigError::Planner { .. }), "{err}");
        assert!(err.to_string().contains(field), "{err}");
    }
}

#[test]
fn the_documented_examples_load() {
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs");
    RunConfig::load(&docs.join("examples/flotilla.toml")).unwrap();
    let local = RunConfig::load(&docs.join("examples/local-openai.toml")).unwrap();
    assert_eq!(
        local.models.roles.planner.as_ref().unwrap().names(),
        ["local/smollm2"]
    );
    // Every TOML block of the configuration guide is a valid part of a flotilla.toml.
    let guide = std::fs::read_to_string(docs.join("configuration.md")).unwrap();
    for block in guide.split("```toml\n").skip(1) {
        let block = block.split("```").next().unwrap();
        FileConfig::parse(block)
            .unwrap_or_else(|e| panic!("docs/configuration.md: {e:?}\n{block}"));
    }
    // And security.md's, which loosen the sandbox on purpose.
    let guide = std::fs::read_to_string(docs.join("security.md")).unwrap();
    for block in guide.split("```toml\n").skip(1) {
        let block = block.split("```").next().unwrap();
        let file =
            FileConfig::parse(block).unwrap_or_else(|e| panic!("docs/security.md: {e:?}\n{block}"));
        file.sandbox.validate().unwrap();
    }
    let guide = std::fs::read_to_string(docs.join("scenarios.md")).unwrap();
    let blocks: Vec<&str> = guide
        .split("```toml\n")
        .skip(1)
        .map(|rest| rest.split("```").next().unwrap())
        .collect();
    assert!(blocks.len() >= 4);
    for block in blocks.iter().filter(|b| !b.contains("[provider]")) {
        if let Err(e) = Scenario::from_toml(block) {
            panic!("docs/scenarios.md example does not load: {e}\n{block}");
        }
    }
}

/// Moved from `prompts` with `load_overrides` (a `prompts_dir` is read by the config).
#[test]
fn overrides_are_read_by_file_name_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("worker.md"), "{{nope}}").unwrap();
    let err = load::load_overrides(dir.path()).unwrap_err().to_string();
    assert!(err.contains("nope") && err.contains("worker.md"), "{err}");
    std::fs::write(dir.path().join("worker.md"), "Work.").unwrap();
    let loaded = load::load_overrides(dir.path()).unwrap();
    assert_eq!(loaded.keys().collect::<Vec<_>>(), ["worker.md"]);
}
