use super::*;
use crate::failures::test_fixtures::*;

#[test]
fn describe_lists_the_failures() {
    let groups = classify_and_group(&parse_output(CommandKind::Build, RUSTC_RENAME_HUMAN), 5);
    let text = describe(&groups[0]);
    assert!(
        text.starts_with("Fix compile errors about `Calc` in src/a.rs, src/b.rs\n"),
        "{text}"
    );
    assert!(text.contains("Files: src/a.rs, src/b.rs\n"), "{text}");
    assert!(
        text.contains("- src/a.rs:3:24 E0425: cannot find type `Calc` in module `calc`\n"),
        "{text}"
    );
    assert!(
        text.contains("- src/b.rs:2:25 E0425: cannot find type `Calc` in module `crate::calc`\n"),
        "{text}"
    );
    let tests = classify_and_group(&parse_output(CommandKind::Test, CARGO_TEST_FAILURES), 5);
    let text = describe(&tests[0]);
    assert!(
        text.contains("- src/a.rs:7:17 test `a::tests::adds`: assertion `left == right` failed\n    left: 4\n    right: 3\n"),
        "{text}"
    );
}

#[test]
fn describe_escapes_control_characters_and_is_bounded() {
    let hostile = "boom\u{1b}]0;pwned\u{7}\u{1b}[2J\r\u{0}\u{202e}txt.exe\u{8}";
    let mut found: Vec<Failure> = (1..=400)
        .map(|l| {
            let mut f = compile_error(
                "src/a.rs",
                l,
                "E0308",
                &format!("{hostile} {}", "x".repeat(480)),
            );
            f.test = Some("t\u{1b}[31m".into());
            f
        })
        .collect();
    found[0].file = Some("src/\u{1b}evil.rs".into());
    let groups = classify_and_group(&found, 5);
    for g in &groups {
        assert!(
            !g.title.chars().any(|c| c.is_control() || is_invisible(c)),
            "{}",
            g.title
        );
        let text = describe(g);
        assert!(text.len() <= MAX_DESCRIPTION_BYTES, "{}", text.len());
        assert!(
            !text
                .chars()
                .any(|c| (c.is_control() && c != '\n') || is_invisible(c)),
            "{text:?}"
        );
        assert!(text.contains("\\u{1b}"), "escaped, not dropped");
    }
    // The path with an escape in it is no path: that failure is unlocated.
    assert_eq!(groups.len(), 2);
    assert_eq!(groups[0].failures_total, 399);
    let text = describe(&groups[0]);
    assert!(text.ends_with("- … and 393 more\n"), "{text}");
    assert!(
        text.contains("Failures (399 in all, 6 listed):\n"),
        "{text}"
    );
    // Parsed output is escaped at the source too.
    let found = parse_output(CommandKind::Build, "src/a.c:1:1: bad\u{7} thing\u{202e}\n");
    assert_eq!(found[0].message, "bad\\u{7} thing\\u{202e}");
}
