use super::*;
use crate::failures::test_fixtures::*;

#[test]
fn go_test_failures_and_build_errors() {
    let found = parse_output(CommandKind::Test, GO_TEST_MIXED);
    let summary: Vec<_> = found
        .iter()
        .map(|f| (f.class, f.file.as_deref(), f.line, f.test.as_deref()))
        .collect();
    assert_eq!(
        summary,
        [
            (
                FailureClass::Compile,
                Some("shapes/shapes_test.go"),
                Some(8),
                None
            ),
            (
                FailureClass::Compile,
                Some("shapes/shapes_test.go"),
                Some(14),
                None
            ),
            (
                FailureClass::Test,
                Some("calc_test.go"),
                Some(12),
                Some("TestAdd")
            ),
            (
                FailureClass::Test,
                Some("calc_test.go"),
                Some(25),
                Some("TestDiv/by_zero")
            ),
        ],
        "{found:#?}"
    );
    assert_eq!(found[0].symbol.as_deref(), Some("NewCircle"));
    assert_eq!(found[2].message, "Add(1, 2) = 4; want 3");
    let go_build = "# example.com/calc\n./calc.go:3:2: undefined: Foo\n./calc.go:9:1: syntax error: unexpected }\n";
    let found = parse_output(CommandKind::Test, go_build);
    assert_eq!(found[0].file.as_deref(), Some("calc.go"));
    assert_eq!(found[0].class, FailureClass::Compile);
    assert_eq!(found[1].class, FailureClass::Build);
}

#[test]
fn go_test_verbose_and_json() {
    let found = parse_output(CommandKind::Test, GO_TEST_VERBOSE);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].test.as_deref(), Some("TestAdd"));
    assert_eq!(at(&found[0]), (Some("calc_test.go"), Some(12), None));
    let json = concat!(
        r#"{"Time":"2024-05-01T10:00:00Z","Action":"run","Package":"example.com/calc","Test":"TestAdd"}"#,
        "\n",
        r#"{"Time":"2024-05-01T10:00:00Z","Action":"output","Package":"example.com/calc","Test":"TestAdd","Output":"--- FAIL: TestAdd (0.00s)\n"}"#,
        "\n",
        r#"{"Time":"2024-05-01T10:00:00Z","Action":"output","Package":"example.com/calc","Test":"TestAdd","Output":"    calc_test.go:12: Add(1, 2) = 4; want 3\n"}"#,
        "\n",
        r#"{"Time":"2024-05-01T10:00:00Z","Action":"fail","Package":"example.com/calc","Test":"TestAdd","Elapsed":0}"#,
        "\n"
    );
    let found = parse_output(CommandKind::Test, json);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(at(&found[0]), (Some("calc_test.go"), Some(12), None));
    assert_eq!(found[0].message, "Add(1, 2) = 4; want 3");
    let build = r#"{"ImportPath":"example.com/calc [example.com/calc.test]","Action":"build-output","Output":"./calc.go:3:2: undefined: Foo\n"}"#;
    let found = parse_output(CommandKind::Test, build);
    assert_eq!(found[0].class, FailureClass::Compile);
    assert_eq!(found[0].symbol.as_deref(), Some("Foo"));
}
