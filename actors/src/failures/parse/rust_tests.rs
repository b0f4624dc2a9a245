use super::*;
use crate::failures::test_fixtures::*;

#[test]
fn rustc_json_keeps_errors_and_skips_notes() {
    let found = parse_output(CommandKind::Build, RUSTC_RENAME_JSON);
    assert_eq!(found.len(), 5, "{found:#?}");
    assert!(found.iter().all(|f| f.class == FailureClass::Compile));
    assert!(found.iter().all(|f| f.symbol.as_deref() == Some("Calc")));
    assert_eq!(found[0].code.as_deref(), Some("E0433"));
    assert_eq!(found[0].message, "cannot find `Calc` in `calc`");
    assert_eq!(at(&found[0]), (Some("src/a.rs"), Some(4), Some(11)));
    assert_eq!(at(&found[4]), (Some("src/b.rs"), Some(2), Some(25)));
}

#[test]
fn rustc_human_output_matches_its_json() {
    let human = parse_output(CommandKind::Build, RUSTC_RENAME_HUMAN);
    let json = parse_output(CommandKind::Build, RUSTC_RENAME_JSON);
    assert_eq!(human, json);
}

#[test]
fn renamed_type_across_two_files_is_one_group() {
    for text in [RUSTC_RENAME_HUMAN, RUSTC_RENAME_JSON] {
        let groups = classify_and_group(&parse_output(CommandKind::Build, text), 5);
        assert_eq!(groups.len(), 1, "{groups:#?}");
        let g = &groups[0];
        assert_eq!(g.class, FailureClass::Compile);
        assert_eq!(g.scope, ["src/a.rs", "src/b.rs"]);
        assert_eq!(g.failures_total, 5);
        assert_eq!(g.cause, "`Calc`");
        assert_eq!(
            g.title,
            "Fix compile errors about `Calc` in src/a.rs, src/b.rs"
        );
    }
}

#[test]
fn rustc_unresolved_import_points_at_the_module_file() {
    let found = parse_output(CommandKind::Build, RUSTC_IMPORT_HUMAN);
    assert_eq!(found.len(), 3, "{found:#?}");
    assert_eq!(found[0].code.as_deref(), Some("E0432"));
    assert_eq!(found[0].symbol.as_deref(), Some("Calc"));
    assert_eq!(found[0].related_file.as_deref(), Some("src/calc.rs"));
    let groups = classify_and_group(&found, 5);
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0].scope, ["src/a.rs", "src/b.rs", "src/calc.rs"]);
    // Not from `crate::`: unsure, so no file.
    assert_eq!(
        rust_module_file("calc::a::Adder", Some("tests/broken.rs")),
        None
    );
    assert_eq!(
        rust_module_file("crate::a::b::X", Some("crates/k/src/lib.rs")).as_deref(),
        Some("crates/k/src/a/b.rs")
    );
    assert_eq!(rust_module_file("crate::X", Some("src/lib.rs")), None);
}

#[test]
fn rustc_short_format() {
    let text = "   Compiling calc v0.1.0 (/tmp/fx/calc)\nsrc/a.rs:2:37: error[E0433]: cannot find `Calc` in `calc`: could not find `Calc` in `calc`\nsrc/a.rs:2:24: error[E0425]: cannot find type `Calc` in module `calc`: not found in `calc`\nsrc/b.rs:1:20: warning: unused variable: `unused`\nsrc/b.rs:1:45: error[E0308]: mismatched types: expected `i64`, found `&str`\nerror: could not compile `calc` (lib) due to 3 previous errors\n";
    let found = parse_output(CommandKind::Test, text);
    assert_eq!(found.len(), 3, "{found:#?}");
    assert!(found.iter().all(|f| f.class == FailureClass::Compile));
    assert_eq!(found[0].symbol.as_deref(), Some("Calc"));
    assert_eq!(at(&found[2]), (Some("src/b.rs"), Some(1), Some(45)));
    assert_eq!(found[2].code.as_deref(), Some("E0308"));
    // gcc's `error:` keeps the command's class.
    let gcc = parse_output(CommandKind::Build, "src/m.c:3:5: error: 'x' undeclared\n");
    assert_eq!(gcc[0].class, FailureClass::Build);
}

#[test]
fn rustc_warnings_are_skipped() {
    let found = parse_output(CommandKind::Build, RUSTC_WARNING_AND_ERROR);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].code.as_deref(), Some("E0505"));
    assert_eq!(found[0].class, FailureClass::Compile);
    assert_eq!(at(&found[0]), (Some("src/b.rs"), Some(5), Some(10)));
    // A borrow error is about a local, not a symbol callers share.
    assert_eq!(found[0].symbol, None);
}

#[test]
fn rustc_syntax_error_is_a_build_failure() {
    let found = parse_output(CommandKind::Typecheck, RUSTC_SYNTAX);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].class, FailureClass::Build);
    assert_eq!(found[0].message, "mismatched closing delimiter: `}`");
    assert_eq!(at(&found[0]), (Some("src/a.rs"), Some(2), Some(13)));
    let expected = "error: expected one of `,`, `:`, or `}`, found `x`\n --> src/c.rs:4:9\n";
    assert_eq!(
        parse_output(CommandKind::Test, expected)[0].class,
        FailureClass::Build
    );
}

#[test]
fn rustc_diff_marker_is_a_conflict_marker_failure() {
    let found = parse_output(CommandKind::Build, RUSTC_DIFF_MARKER);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].class, FailureClass::ConflictMarkers);
    assert_eq!(at(&found[0]), (Some("src/a.rs"), Some(1), Some(1)));
}

#[test]
fn cargo_manifest_and_dependency_errors_are_build_failures() {
    let found = parse_output(CommandKind::Test, CARGO_MANIFEST);
    let summary: Vec<(FailureClass, Option<&str>, &str)> = found
        .iter()
        .map(|f| (f.class, f.file.as_deref(), f.message.as_str()))
        .collect();
    assert_eq!(
        summary,
        [
            (
                FailureClass::Build,
                Some("Cargo.toml"),
                "unclosed inline table, expected `}`"
            ),
            (
                FailureClass::Build,
                Some("Cargo.toml"),
                "invalid type: integer `3`, expected a string"
            ),
            (
                FailureClass::Build,
                None,
                "no matching package named `serde_nonexistent_zz` found"
            ),
            (
                FailureClass::Build,
                Some("Cargo.toml"),
                "could not find `Cargo.toml` in `/tmp` or any parent directory"
            ),
        ]
    );
}

#[test]
fn linker_errors_are_build_failures() {
    let text = "error: linking with `cc` failed: exit status: 1\n  |\n  = note: some arguments are omitted\n  = note: /usr/bin/ld: calc.o: in function `main':\n          calc.c:(.text+0x9): undefined reference to `add_numbers'\n          collect2: error: ld returned 1 exit status\n\nerror: could not compile `calc` (bin \"calc\") due to 1 previous error\n";
    let found = parse_output(CommandKind::Build, text);
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(
        found
            .iter()
            .all(|f| f.class == FailureClass::Build && f.file.is_none())
    );
    assert_eq!(found[1].symbol.as_deref(), Some("add_numbers"));
    let groups = classify_and_group(&found, 5);
    assert_eq!(groups.len(), 1);
    assert!(groups[0].scope.is_empty());
}
