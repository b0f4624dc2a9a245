use super::*;
use crate::failures::test_fixtures::*;

#[test]
fn conflict_markers_outrank_everything() {
    let mut found = parse_output(CommandKind::Build, RUSTC_SYNTAX);
    found.extend(parse_output(CommandKind::Build, RUSTC_RENAME_HUMAN));
    found.extend(parse_output(CommandKind::Test, CARGO_TEST_FAILURES));
    found.extend(markers_failures(&[
        ("./src/z.rs".to_string(), 30),
        ("src/z.rs".to_string(), 10),
        ("src/y.rs".to_string(), 1),
        ("src/z.rs".to_string(), 20),
    ]));
    let groups = classify_and_group(&found, 5);
    assert_eq!(groups.len(), 2, "{groups:#?}");
    assert!(
        groups
            .iter()
            .all(|g| g.class == FailureClass::ConflictMarkers)
    );
    assert_eq!(groups[0].scope, ["src/y.rs"]);
    assert_eq!(groups[1].scope, ["src/z.rs"]);
    assert_eq!(
        groups[1].title,
        "Resolve merge conflict markers in src/z.rs"
    );
    let z = &groups[1].failures[0];
    assert_eq!(z.line, Some(10));
    assert!(z.message.ends_with("at lines 10, 20, 30"), "{}", z.message);
}

#[test]
fn same_file_different_causes_are_two_groups() {
    let found = parse_output(CommandKind::Build, RUSTC_TWO_CAUSES);
    assert_eq!(found.len(), 2, "{found:#?}");
    let groups = classify_and_group(&found, 5);
    assert_eq!(groups.len(), 2, "{groups:#?}");
    assert!(groups.iter().all(|g| g.scope == ["src/b.rs"]));
    let causes: BTreeSet<&str> = groups.iter().map(|g| g.cause.as_str()).collect();
    assert_eq!(causes, BTreeSet::from(["E0061", "E0308"]));
    assert!(
        groups
            .iter()
            .any(|g| g.title == "Fix compile error E0308 (mismatched types) in src/b.rs")
    );
    // Same file, same code: one group.
    let twice = format!(
        "{RUSTC_TWO_CAUSES}{}",
        RUSTC_TWO_CAUSES.replace("src/b.rs:3:21", "src/b.rs:9:21")
    );
    let groups = classify_and_group(&parse_output(CommandKind::Build, &twice), 5);
    assert_eq!(groups.len(), 2);
    assert_eq!(groups[0].failures_total, 2);
    assert_eq!(groups[0].cause, "E0308");
}

#[test]
fn max_groups_caps_the_groups_biggest_first() {
    let mut found = Vec::new();
    for (i, file) in [
        "src/a.rs", "src/b.rs", "src/c.rs", "src/d.rs", "src/e.rs", "src/f.rs", "src/g.rs",
    ]
    .iter()
    .enumerate()
    {
        for line in 0..=(i % 3) {
            found.push(compile_error(
                file,
                line as u32 + 1,
                "E0308",
                "mismatched types",
            ));
        }
    }
    let groups = classify_and_group(&found, 5);
    assert_eq!(groups.len(), 5);
    let order: Vec<(&str, usize)> = groups
        .iter()
        .map(|g| (g.scope[0].as_str(), g.failures_total))
        .collect();
    assert_eq!(
        order,
        [
            ("src/c.rs", 3),
            ("src/f.rs", 3),
            ("src/b.rs", 2),
            ("src/e.rs", 2),
            ("src/a.rs", 1)
        ]
    );
    assert!(classify_and_group(&found, 0).is_empty());
    assert!(classify_and_group(&[], 5).is_empty());
    // A group keeps 20 failures and counts them all.
    let many: Vec<Failure> = (1..=45)
        .map(|l| compile_error("src/a.rs", l, "E0308", "mismatched types"))
        .collect();
    let groups = classify_and_group(&many, 5);
    assert_eq!(groups[0].failures.len(), MAX_GROUP_FAILURES);
    assert_eq!(groups[0].failures_total, 45);
}

#[test]
fn signatures_survive_reordering_and_moved_lines() {
    let before = classify_and_group(&parse_output(CommandKind::Build, RUSTC_RENAME_HUMAN), 5);
    // The next sweep: the same problem, lines moved, errors in another order.
    let mut moved = parse_output(CommandKind::Build, RUSTC_RENAME_JSON);
    for f in &mut moved {
        f.line = f.line.map(|l| l + 40);
        f.column = f.column.map(|c| c + 1);
    }
    moved.reverse();
    let after = classify_and_group(&moved, 5);
    assert_eq!(before.len(), 1);
    assert_eq!(before[0].signature, after[0].signature);
    assert!(before[0].signature.starts_with("compile-"));
    assert!(!before[0].signature.contains(char::is_whitespace));

    let two = classify_and_group(&parse_output(CommandKind::Build, RUSTC_TWO_CAUSES), 5);
    let shifted = RUSTC_TWO_CAUSES
        .replace("src/b.rs:3:21", "src/b.rs:13:2")
        .replace("src/b.rs:4:5", "src/b.rs:17:1");
    let mut again = parse_output(CommandKind::Build, &shifted);
    again.reverse();
    let again = classify_and_group(&again, 5);
    let sigs = |g: &[FixGroup]| {
        g.iter()
            .map(|g| g.signature.clone())
            .collect::<BTreeSet<_>>()
    };
    assert_eq!(sigs(&two), sigs(&again));
    assert_eq!(sigs(&two).len(), 2);
    // A different problem is a different signature.
    assert_ne!(before[0].signature, two[0].signature);
    // Test groups: the same failing file, whatever the test output says.
    let t1 = classify_and_group(&parse_output(CommandKind::Test, CARGO_TEST_FAILURES), 5);
    let t2 = classify_and_group(
        &parse_output(
            CommandKind::Test,
            &CARGO_TEST_FAILURES.replace("left: 4", "left: 5"),
        ),
        5,
    );
    assert_eq!(sigs(&t1), sigs(&t2));
    // Message causes mask their numbers.
    let a = classify_and_group(
        &parse_output(CommandKind::Build, "build.sh:3: needs 2 args\n"),
        5,
    );
    let b = classify_and_group(
        &parse_output(CommandKind::Build, "build.sh:9: needs 3 args\n"),
        5,
    );
    assert_eq!(a[0].signature, b[0].signature);
}

#[test]
fn unlocated_failures_form_one_whole_repo_group() {
    let mut found = vec![
        Failure::new(FailureClass::Build, "first".into()),
        Failure::new(FailureClass::Build, "second".into()),
    ];
    found[1].symbol = Some("foo".into());
    let mut located = Failure::new(FailureClass::Build, "expected `;`".into());
    located.file = Some("src/a.rs".into());
    found.push(located);
    let groups = classify_and_group(&found, 5);
    assert_eq!(groups.len(), 2, "{groups:#?}");
    let whole: Vec<&FixGroup> = groups.iter().filter(|g| g.scope.is_empty()).collect();
    assert_eq!(whole.len(), 1);
    assert_eq!(whole[0].failures_total, 2);
    assert_eq!(
        whole[0].title,
        "Fix build failures reported without a file location: first"
    );
}
