use super::*;
use crate::failures::test_fixtures::*;

#[test]
fn tsc_plain_output() {
    let found = parse_output(CommandKind::Typecheck, TSC_PLAIN);
    assert_eq!(found.len(), 6, "{found:#?}");
    assert_eq!(found[0].code.as_deref(), Some("TS2305"));
    assert_eq!(found[0].symbol.as_deref(), Some("Circle"));
    assert_eq!(found[0].related_file.as_deref(), Some("src/shapes.ts"));
    assert_eq!(at(&found[0]), (Some("src/app.ts"), Some(1), Some(10)));
    assert_eq!(found[1].symbol.as_deref(), Some("Circle"));
    assert_eq!(found[2].related_file.as_deref(), Some("src/shapes.ts"));
    assert_eq!(found[3].symbol, None);
    assert_eq!(found[3].class, FailureClass::Compile);
    assert_eq!(found[5].class, FailureClass::Build, "TS1xxx is syntax");
}

#[test]
fn tsc_pretty_output() {
    let found = parse_output(CommandKind::Typecheck, TSC_PRETTY);
    assert_eq!(found.len(), 2, "{found:#?}");
    assert_eq!(found[0].code.as_deref(), Some("TS2307"));
    assert_eq!(found[0].related_file.as_deref(), Some("src/shapes.ts"));
    assert_eq!(at(&found[1]), (Some("src/util.ts"), Some(12), Some(7)));
    assert_eq!(
        found[1].message,
        "Type 'string' is not assignable to type 'number'."
    );
    // Colored, as with --pretty on a terminal.
    let colored = "\u{1b}[96msrc/a.ts\u{1b}[0m:\u{1b}[93m3\u{1b}[0m:\u{1b}[93m5\u{1b}[0m - \u{1b}[91merror\u{1b}[0m\u{1b}[90m TS2304: \u{1b}[0mCannot find name 'Foo'.\n";
    let found = parse_output(CommandKind::Typecheck, colored);
    assert_eq!(at(&found[0]), (Some("src/a.ts"), Some(3), Some(5)));
    assert_eq!(found[0].symbol.as_deref(), Some("Foo"));
}

#[test]
fn import_chain_groups_both_files() {
    let text =
        "src/app.ts(1,10): error TS2305: Module './shapes' has no exported member 'Circle'.\n";
    let groups = classify_and_group(&parse_output(CommandKind::Typecheck, text), 5);
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0].scope, ["src/app.ts", "src/shapes.ts"]);
    // Everything about `Circle`, and what imports from src/shapes.ts, is one task.
    let groups = classify_and_group(&parse_output(CommandKind::Typecheck, TSC_PLAIN), 5);
    assert_eq!(
        groups[0].class,
        FailureClass::Build,
        "the syntax error outranks"
    );
    let typed: Vec<Failure> = parse_output(CommandKind::Typecheck, TSC_PLAIN)
        .into_iter()
        .filter(|f| f.class == FailureClass::Compile)
        .collect();
    let groups = classify_and_group(&typed, 5);
    assert_eq!(groups.len(), 2, "{groups:#?}");
    assert_eq!(
        groups[0].scope,
        ["src/app.ts", "src/geometry/area.ts", "src/shapes.ts"]
    );
    assert_eq!(groups[0].failures_total, 3);
    assert_eq!(groups[1].scope, ["src/util.ts"]);
    assert_eq!(groups[1].cause, "TS2322");
    // A chain without a symbol (the module is missing) still joins both files.
    let groups = classify_and_group(&parse_output(CommandKind::Typecheck, TSC_PRETTY), 5);
    assert_eq!(groups[0].scope, ["src/app.ts", "src/shapes.ts"]);
    assert_eq!(groups[0].cause, "imports from src/shapes.ts");
    assert_eq!(ts_module_file("src/a.ts", "../../x"), None);
    assert_eq!(ts_module_file("src/a.ts", "react"), None);
    assert_eq!(
        ts_module_file("src/a/b.ts", "../c.js").as_deref(),
        Some("src/c.ts")
    );
}
