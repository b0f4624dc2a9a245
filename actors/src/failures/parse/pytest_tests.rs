use super::*;
use crate::failures::test_fixtures::*;

#[test]
fn pytest_failures_with_locations() {
    let found = parse_output_in(
        CommandKind::Test,
        PYTEST_FAILURES,
        Some("/tmp/flotilla-sweep-7/repo"),
    );
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(found.iter().all(|f| f.class == FailureClass::Test));
    assert_eq!(found[0].test.as_deref(), Some("test_add"));
    assert_eq!(at(&found[0]), (Some("tests/test_calc.py"), Some(12), None));
    assert_eq!(found[0].message, "assert 3 == 4");
    assert_eq!(found[1].test.as_deref(), Some("TestCalc::test_div"));
    assert_eq!(at(&found[1]), (Some("tests/test_calc.py"), Some(20), None));
    assert_eq!(classify_and_group(&found, 5).len(), 1);
}

#[test]
fn pytest_collection_error_is_a_compile_error_with_its_import_chain() {
    let found = parse_output_in(
        CommandKind::Test,
        PYTEST_COLLECTION,
        Some("/tmp/flotilla-sweep-7/repo/"),
    );
    assert_eq!(found.len(), 1, "{found:#?}");
    let f = &found[0];
    assert_eq!(f.class, FailureClass::Compile);
    assert_eq!(f.file.as_deref(), Some("tests/test_shapes.py"));
    assert_eq!(
        f.message,
        "ImportError: cannot import name 'Circle' from 'shapes' (shapes.py)"
    );
    assert_eq!(f.symbol.as_deref(), Some("Circle"));
    assert_eq!(f.related_file.as_deref(), Some("shapes.py"));
    // Without the root the module's path is absolute: no related file.
    let found = parse_output(CommandKind::Test, PYTEST_COLLECTION);
    assert_eq!(found[0].related_file, None);
    // An older summary line with its message.
    let text = "ERROR tests/test_x.py - ModuleNotFoundError: No module named 'calc'\n";
    let found = parse_output(CommandKind::Test, text);
    assert_eq!(found[0].class, FailureClass::Compile);
    assert_eq!(found[0].symbol.as_deref(), Some("calc"));
}
