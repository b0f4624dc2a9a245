use super::*;
use crate::failures::test_fixtures::*;

#[test]
fn paths_are_normalized_and_roots_stripped() {
    assert_eq!(
        normalize_path("./src/./a.rs", None).as_deref(),
        Some("src/a.rs")
    );
    assert_eq!(
        normalize_path("src\\b\\c.rs", None).as_deref(),
        Some("src/b/c.rs")
    );
    assert_eq!(
        normalize_path("src//a.rs", None).as_deref(),
        Some("src/a.rs")
    );
    assert_eq!(normalize_path("/abs/a.rs", None), None);
    assert_eq!(normalize_path("C:\\x\\a.rs", None), None);
    assert_eq!(normalize_path("src/../../etc/passwd", None), None);
    assert_eq!(normalize_path("src/../a.rs", None), None);
    assert_eq!(
        normalize_path("/tmp/s/src/a.rs", Some("/tmp/s")).as_deref(),
        Some("src/a.rs")
    );
    assert_eq!(normalize_path("/tmp/s2/src/a.rs", Some("/tmp/s")), None);
    let text = "/tmp/scratch-1/src/a.rs:3:1: failed to open /tmp/scratch-1/data/x.bin\n/elsewhere/b.rs:1:1: bad\n";
    let found = parse_output_in(CommandKind::Build, text, Some("/tmp/scratch-1/"));
    assert_eq!(found[0].file.as_deref(), Some("src/a.rs"));
    assert_eq!(found[0].message, "failed to open data/x.bin");
    assert_eq!(found[1].file, None);
    // A root of `/` would make every absolute path look like the repository's.
    let found = parse_output_in(CommandKind::Build, "/etc/x.conf:1: bad\n", Some("/"));
    assert_eq!(found[0].file, None);
    let json = r#"{"reason":"compiler-message","message":{"level":"error","message":"cannot find value `y` in this scope","code":{"code":"E0425"},"spans":[{"file_name":"/tmp/scratch-1/src/c.rs","line_start":2,"column_start":3,"is_primary":true}]}}"#;
    let found = parse_output_in(CommandKind::Build, json, Some("/tmp/scratch-1"));
    assert_eq!(at(&found[0]), (Some("src/c.rs"), Some(2), Some(3)));
    let found = parse_output(CommandKind::Build, json);
    assert_eq!(found[0].file, None, "absolute without a root");
}
