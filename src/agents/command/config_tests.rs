use super::*;

fn config(toml_text: &str) -> CommandAgentConfig {
    toml::from_str(toml_text).unwrap()
}

#[test]
fn a_preset_fills_in_what_the_config_leaves_out_and_every_field_overrides_it() {
    let claude = config("preset = \"claude-code\"").resolved().unwrap();
    assert_eq!(claude.program, "claude");
    assert_eq!(
        claude.args,
        ["-p", "--output-format", "stream-json", "--verbose"]
    );
    assert_eq!(claude.prompt, PromptVia::Stdin);
    assert_eq!(claude.output, OutputFormat::ClaudeStreamJson);
    assert_eq!(claude.result, ResultVia::Stream);
    assert_eq!(claude.env.secrets, ["ANTHROPIC_API_KEY"]);
    assert_eq!(claude.limits.stall, Some(Duration::from_secs(300)));
    assert_eq!(claude.limits.output_bytes, 64 * 1024);
    assert!(claude.limits.wall >= Duration::from_secs(3600));

    let codex = config("preset = \"codex\"").resolved().unwrap();
    assert_eq!(
        (codex.program.as_str(), codex.args.clone()),
        ("codex", vec!["exec".into(), "--json".into()])
    );
    assert_eq!(codex.output, OutputFormat::CodexJson);
    assert_eq!(codex.result, ResultVia::Stream);
    assert_eq!(codex.env.secrets, ["OPENAI_API_KEY"]);

    let aider = config("preset = \"aider\"").resolved().unwrap();
    assert_eq!(aider.prompt, PromptVia::File);
    assert_eq!(aider.args.last().unwrap(), "{prompt_file}");
    assert_eq!(aider.output, OutputFormat::Text);
    assert_eq!(aider.result, ResultVia::File, "text has no final event");
    assert_eq!(aider.env.secrets, ["OPENAI_API_KEY", "ANTHROPIC_API_KEY"]);
    assert_eq!(
        aider.leftovers,
        [".aider.tags.cache.v3", ".aider.tags.cache.v4"]
    );
    for flag in ["--no-gitignore", "--no-auto-commits", "--no-analytics"] {
        assert!(aider.args.iter().any(|a| a == flag), "{flag}");
    }
    let identity: Vec<&str> = aider.set_env.iter().map(|(n, _)| n.as_str()).collect();
    assert!(
        identity.contains(&"GIT_CONFIG_COUNT")
            && identity.contains(&"LITELLM_LOCAL_MODEL_COST_MAP"),
        "a git identity, no price-map fetch: {identity:?}"
    );
    assert!(codex.set_env.is_empty() && claude.set_env.is_empty());

    // extra_args add to the preset's arguments; args replace them.
    let more = config("preset = \"aider\"\nextra_args = [\"--model\", \"openai/qwen\"]")
        .resolved()
        .unwrap();
    assert_eq!(more.args.len(), AIDER_ARGS.len() + 2);
    assert_eq!(&more.args[..AIDER_ARGS.len()], AIDER_ARGS);
    assert_eq!(&more.args[AIDER_ARGS.len()..], ["--model", "openai/qwen"]);
    let replaced = config("preset = \"codex\"\nargs = [\"exec\"]\nextra_args = [\"--ephemeral\"]")
        .resolved()
        .unwrap();
    assert_eq!(replaced.args, ["exec", "--ephemeral"]);
    let old_name = config("preset = \"codex\"\nresult = \"stdout\"")
        .resolved()
        .unwrap();
    assert_eq!(
        old_name.result,
        ResultVia::Stream,
        "the old name still reads"
    );

    let mine = config(
        r#"
preset = "claude-code"
program = "/opt/claude/bin/claude"
args = ["-p", "--output-format", "stream-json", "--verbose", "--permission-mode", "acceptEdits"]
result = "file"
stall_secs = 60
output_bytes = 1024
secrets = ["MY_ANTHROPIC_KEY"]
env_pass = ["EDITOR"]
sandbox = "bwrap"
"#,
    )
    .resolved()
    .unwrap();
    assert_eq!(mine.program, "/opt/claude/bin/claude");
    assert_eq!(mine.args.len(), 6);
    assert_eq!(mine.output, OutputFormat::ClaudeStreamJson, "kept");
    assert_eq!(mine.result, ResultVia::File);
    assert_eq!(mine.limits.stall, Some(Duration::from_secs(60)));
    assert_eq!(mine.limits.output_bytes, 1024);
    assert_eq!(mine.env.secrets, ["MY_ANTHROPIC_KEY"]);
    assert_eq!(mine.env.pass, ["EDITOR"]);
    assert_eq!(mine.sandbox, Sandbox::Bwrap);

    let plain = config("program = \"my-agent\"").resolved().unwrap();
    assert!(plain.args.is_empty());
    assert_eq!(
        (plain.prompt, plain.output, plain.result),
        (PromptVia::Stdin, OutputFormat::Text, ResultVia::File)
    );
    assert!(plain.leftovers.is_empty());
    let structured = config("program = \"my-agent\"\noutput = \"codex_json\"")
        .resolved()
        .unwrap();
    assert_eq!(structured.result, ResultVia::Stream);
    assert!(plain.env.secrets.is_empty());
}

#[test]
fn impossible_settings_are_refused_by_name() {
    assert!(toml::from_str::<CommandAgentConfig>("progam = \"x\"").is_err());
    assert!(toml::from_str::<CommandAgentConfig>("preset = \"cursor\"").is_err());
    assert_eq!(
        config("").validate(),
        Err(CommandAgentConfigError::NoProgram)
    );
    assert_eq!(
        config("program = \" \"").validate(),
        Err(CommandAgentConfigError::NoProgram)
    );
    assert_eq!(
        config("program = \"a\"\nstall_secs = 0").validate(),
        Err(CommandAgentConfigError::Zero("stall_secs"))
    );
    assert_eq!(
        config("program = \"a\"\noutput_bytes = 0").validate(),
        Err(CommandAgentConfigError::Zero("output_bytes"))
    );
    assert_eq!(
        config("program = \"a\"\nargs = [\"--in\", \"{prompt_file}\"]").validate(),
        Err(CommandAgentConfigError::PlaceholderWithoutFile {
            placeholder: "{prompt_file}",
            field: "prompt"
        })
    );
    assert_eq!(
        config("preset = \"aider\"\nprompt = \"stdin\"").validate(),
        Err(CommandAgentConfigError::PlaceholderWithoutFile {
            placeholder: "{prompt_file}",
            field: "prompt"
        }),
        "an override that contradicts the preset's arguments"
    );
    assert_eq!(
        config("program = \"a\"\noutput = \"codex_json\"\nargs = [\"--out={result_file}\"]")
            .validate(),
        Err(CommandAgentConfigError::PlaceholderWithoutFile {
            placeholder: "{result_file}",
            field: "result"
        })
    );
    assert_eq!(
        config("program = \"a\"\nresult = \"stdout\"").validate(),
        Err(CommandAgentConfigError::StreamResultFromText),
        "plain text has no channel of its own: the last JSON printed is not one"
    );
    assert_eq!(
        config("preset = \"aider\"\nresult = \"stream\"").validate(),
        Err(CommandAgentConfigError::StreamResultFromText)
    );
    assert!(
        config("program = \"a\"\nargs = [\"--out={result_file}\"]\nresult = \"file\"")
            .validate()
            .is_ok()
    );
    assert_eq!(
        config("program = \"a\"\nenv_pass = [\"GITHUB_TOKEN\"]").validate(),
        Err(CommandAgentConfigError::SecretInEnvPass(
            "GITHUB_TOKEN".into()
        ))
    );
    assert_eq!(
        config("program = \"a\"\nsecrets = [\"A=B\"]").validate(),
        Err(CommandAgentConfigError::BadVariable {
            field: "secrets",
            name: "A=B".into()
        })
    );
    assert!(
        CommandAgentConfigError::Zero("stall_secs")
            .to_string()
            .contains("stall_secs")
    );
}
