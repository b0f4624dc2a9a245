use super::*;

#[test]
fn a_command_that_timed_out_says_so_and_keeps_what_it_printed() {
    let found = timed_out(CommandKind::Test, "cargo test", 600, "", None);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].message, "`cargo test` timed out after 600 s");
    let found = timed_out(
        CommandKind::Test,
        "make\x1b]0;title\x07",
        5,
        "src/a.rs:3: error: boom\n",
        None,
    );
    assert_eq!(found.len(), 2, "{found:?}");
    assert_eq!(found[0].file.as_deref(), Some("src/a.rs"));
    assert!(found[1].message.contains("timed out after 5 s"));
    assert!(!found[1].message.contains('\x1b'), "{}", found[1].message);
}

#[test]
fn a_fix_scope_follows_the_rules_of_any_tasks_scope() {
    let paths = |v: &[&str]| v.iter().map(|p| p.to_string()).collect::<Vec<_>>();
    assert_eq!(
        fix_scope(
            &paths(&[
                "./src/a.rs",
                "src/a.rs",
                ".GIT/config",
                ".Git/x",
                "/abs",
                "a/../../b",
                "b.rs"
            ]),
            64,
            1024
        ),
        Ok(paths(&["b.rs", "src/a.rs"]))
    );
    let why = fix_scope(&[], 64, 1024).unwrap_err().to_string();
    assert!(why.contains("empty scope"), "{why}");
    let why = fix_scope(&paths(&[".gIt/config", "/etc/x"]), 64, 1024)
        .unwrap_err()
        .to_string();
    assert!(why.contains("none of the 2 files"), "{why}");
    let many: Vec<String> = (0..65).map(|i| format!("f{i}")).collect();
    let why = fix_scope(&many, 64, 1024).unwrap_err().to_string();
    assert!(why.contains("65 files") && why.contains("(64"), "{why}");
    assert_eq!(fix_scope(&many[..64], 64, 1024).map(|s| s.len()), Ok(64));
}

// --- the types ---------------------------------------------------------------------

#[test]
fn classes_order_by_priority_and_display() {
    use FailureClass::*;
    assert!(ConflictMarkers > Build && Build > Compile && Compile > Test);
    assert_eq!(
        [Test, ConflictMarkers, Compile].into_iter().max(),
        Some(ConflictMarkers)
    );
    assert!(ConflictMarkers.priority() > Build.priority());
    assert!(Build.priority() > Compile.priority());
    assert!(Compile.priority() > Test.priority());
    let shown: Vec<String> = [ConflictMarkers, Build, Compile, Test]
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        shown,
        [
            "conflict markers",
            "build failure",
            "compile error",
            "test failure"
        ]
    );
    assert_eq!(
        serde_json::to_string(&ConflictMarkers).unwrap(),
        "\"conflict_markers\""
    );
    assert_eq!(
        serde_json::to_string(&CommandKind::Typecheck).unwrap(),
        "\"typecheck\""
    );
}
