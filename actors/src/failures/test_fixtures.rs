//! The captured tool outputs the parser tests read, and their shared helper.

use super::{Failure, FailureClass};

pub(super) const RUSTC_RENAME_HUMAN: &str =
    include_str!("../../tests/fixtures/failures/rustc_rename_human.txt");
pub(super) const RUSTC_RENAME_JSON: &str =
    include_str!("../../tests/fixtures/failures/rustc_rename_json.txt");
pub(super) const RUSTC_IMPORT_HUMAN: &str =
    include_str!("../../tests/fixtures/failures/rustc_import_human.txt");
pub(super) const RUSTC_SYNTAX: &str =
    include_str!("../../tests/fixtures/failures/rustc_syntax_human.txt");
pub(super) const RUSTC_DIFF_MARKER: &str =
    include_str!("../../tests/fixtures/failures/rustc_diff_marker_human.txt");
pub(super) const RUSTC_WARNING_AND_ERROR: &str =
    include_str!("../../tests/fixtures/failures/rustc_warning_and_error.txt");
pub(super) const RUSTC_TWO_CAUSES: &str =
    include_str!("../../tests/fixtures/failures/rustc_two_causes_one_file.txt");
pub(super) const CARGO_MANIFEST: &str =
    include_str!("../../tests/fixtures/failures/cargo_manifest_errors.txt");
pub(super) const CARGO_TEST_FAILURES: &str =
    include_str!("../../tests/fixtures/failures/cargo_test_failures.txt");
pub(super) const CARGO_TEST_COMPILE: &str =
    include_str!("../../tests/fixtures/failures/cargo_test_compile_error.txt");
pub(super) const TSC_PLAIN: &str = include_str!("../../tests/fixtures/failures/tsc_plain.txt");
pub(super) const TSC_PRETTY: &str = include_str!("../../tests/fixtures/failures/tsc_pretty.txt");
pub(super) const PYTEST_FAILURES: &str =
    include_str!("../../tests/fixtures/failures/pytest_failures.txt");
pub(super) const PYTEST_COLLECTION: &str =
    include_str!("../../tests/fixtures/failures/pytest_collection_error.txt");
pub(super) const GO_TEST_MIXED: &str =
    include_str!("../../tests/fixtures/failures/go_test_mixed.txt");
pub(super) const GO_TEST_VERBOSE: &str =
    include_str!("../../tests/fixtures/failures/go_test_verbose.txt");

pub(super) fn at(f: &Failure) -> (Option<&str>, Option<u32>, Option<u32>) {
    (f.file.as_deref(), f.line, f.column)
}

pub(super) fn compile_error(file: &str, line: u32, code: &str, message: &str) -> Failure {
    let mut f = Failure::new(FailureClass::Compile, message.to_string());
    f.file = Some(file.to_string());
    f.line = Some(line);
    f.code = Some(code.to_string());
    f
}
