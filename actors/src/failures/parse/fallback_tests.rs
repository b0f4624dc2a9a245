use super::*;

#[test]
fn generic_fallback_takes_its_class_from_the_command() {
    let text = "./build.sh:12: syntax error near unexpected token `fi'\nsrc/main.c:3:5: error: 'x' undeclared (first use in this function)\nsrc/main.c:3:5: note: each undeclared identifier is reported only once\nMakefile:4: recipe for target 'all' failed\nlocalhost:8080: connection refused\nError: 12:30: nothing\n  indented/file.c:1:1: not at the start\n";
    let found = parse_output(CommandKind::Build, text);
    let summary: Vec<_> = found
        .iter()
        .map(|f| {
            (
                f.class,
                f.file.as_deref(),
                f.line,
                f.column,
                f.message.as_str(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (
                FailureClass::Build,
                Some("build.sh"),
                Some(12),
                None,
                "syntax error near unexpected token `fi'"
            ),
            (
                FailureClass::Build,
                Some("src/main.c"),
                Some(3),
                Some(5),
                "'x' undeclared (first use in this function)"
            ),
        ]
    );
    let mypy = "src/calc.py:3: error: Name \"Foo\" is not defined  [name-defined]\n";
    assert_eq!(
        parse_output(CommandKind::Typecheck, mypy)[0].class,
        FailureClass::Compile
    );
    assert_eq!(
        parse_output(CommandKind::Test, mypy)[0].class,
        FailureClass::Test
    );
}

#[test]
fn unparsed_output_gives_one_catch_all_failure() {
    let text = "Compiling...\n\nSegmentation fault (core dumped)\nmake: *** [all] Error 139\n\n";
    let found = parse_output(CommandKind::Build, text);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].class, FailureClass::Build);
    assert_eq!(found[0].file, None);
    assert_eq!(
        found[0].message,
        "Compiling...\nSegmentation fault (core dumped)\nmake: *** [all] Error 139"
    );
    let found = parse_output(CommandKind::Test, "");
    assert_eq!(found[0].class, FailureClass::Test);
    assert_eq!(
        found[0].message,
        "the command failed without printing anything"
    );
    // The tail is bounded: the last lines are kept.
    let long: String = (0..2_000).map(|i| format!("line {i}\n")).collect();
    let found = parse_output(CommandKind::Typecheck, &long);
    assert!(found[0].message.len() <= MAX_TAIL_BYTES);
    assert!(found[0].message.ends_with("line 1999"));
    assert_eq!(found[0].class, FailureClass::Compile);
    // An uncoded `error:` without a span is not trusted as rustc's, so only the
    // catch-all shows it.
    let found = parse_output(CommandKind::Test, "error: Recipe `test` failed on line 3\n");
    assert_eq!(found[0].class, FailureClass::Test);
    assert_eq!(found[0].message, "error: Recipe `test` failed on line 3");
}
