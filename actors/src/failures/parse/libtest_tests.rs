use super::*;
use crate::failures::test_fixtures::*;

#[test]
fn cargo_test_failures_carry_their_panic_location() {
    let found = parse_output(CommandKind::Test, CARGO_TEST_FAILURES);
    let tests: Vec<_> = found
        .iter()
        .map(|f| (f.test.as_deref().unwrap(), at(f)))
        .collect();
    assert_eq!(
        tests,
        [
            ("a::tests::adds_zero", (Some("src/a.rs"), Some(9), Some(22))),
            ("a::tests::adds", (Some("src/a.rs"), Some(7), Some(17))),
            (
                "a::tests::must_panic",
                (Some("src/a.rs"), Some(14), Some(8))
            ),
            ("integration_adds", (Some("tests/it.rs"), Some(4), Some(14))),
        ]
    );
    assert!(found.iter().all(|f| f.class == FailureClass::Test));
    assert_eq!(
        found[1].message,
        "assertion `left == right` failed\nleft: 4\nright: 3"
    );
    assert_eq!(found[2].message, "test did not panic as expected");
    let groups = classify_and_group(&found, 5);
    let scopes: Vec<&[String]> = groups.iter().map(|g| g.scope.as_slice()).collect();
    assert_eq!(
        scopes,
        [
            &["src/a.rs".to_string()][..],
            &["tests/it.rs".to_string()][..]
        ]
    );
    assert_eq!(groups[0].title, "Fix test failures in src/a.rs");
}

#[test]
fn cargo_test_old_panic_format_and_doctests() {
    let text = "test tests::adds ... FAILED\ntest src/lib.rs - add (line 5) ... FAILED\n\nfailures:\n\n---- tests::adds stdout ----\nthread 'tests::adds' panicked at 'assertion failed: `(left == right)`\n  left: `3`,\n right: `4`', src/lib.rs:10:5\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n";
    let found = parse_output(CommandKind::Test, text);
    assert_eq!(found.len(), 2, "{found:#?}");
    assert_eq!(at(&found[0]), (Some("src/lib.rs"), Some(10), Some(5)));
    assert_eq!(
        found[0].message,
        "assertion failed: `(left == right)`\nleft: `3`,\nright: `4`"
    );
    assert_eq!(found[1].test.as_deref(), Some("src/lib.rs - add (line 5)"));
    assert_eq!(at(&found[1]), (Some("src/lib.rs"), Some(5), None));
}

#[test]
fn a_test_run_that_failed_to_compile_gives_compile_failures() {
    let found = parse_output(CommandKind::Test, CARGO_TEST_COMPILE);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].class, FailureClass::Compile);
    assert_eq!(found[0].symbol.as_deref(), Some("Adder"));
    assert_eq!(at(&found[0]), (Some("tests/broken.rs"), Some(1), Some(5)));
}

#[test]
fn a_compile_error_outranks_failing_tests() {
    let mut found = parse_output(CommandKind::Test, CARGO_TEST_FAILURES);
    found.extend(parse_output(CommandKind::Build, RUSTC_TWO_CAUSES));
    let groups = classify_and_group(&found, 5);
    assert!(!groups.is_empty());
    assert!(
        groups.iter().all(|g| g.class == FailureClass::Compile),
        "{groups:#?}"
    );
    // The same in one output (go test: one package failed to build, another's tests
    // failed).
    let groups = classify_and_group(&parse_output(CommandKind::Test, GO_TEST_MIXED), 5);
    assert_eq!(groups.len(), 1, "{groups:#?}");
    assert_eq!(groups[0].class, FailureClass::Compile);
    assert_eq!(groups[0].cause, "`NewCircle`");
}
