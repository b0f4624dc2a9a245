use super::*;

#[test]
fn parsing_is_bounded() {
    let many: String = (0..3_000)
        .map(|i| format!("src/f{i}.c:1:1: error: bad\n"))
        .collect();
    let found = parse_output(CommandKind::Build, &many);
    assert_eq!(found.len(), MAX_FAILURES);
    let long = format!("src/a.c:1:1: {}\n", "é".repeat(5_000));
    let found = parse_output(CommandKind::Build, &long);
    assert_eq!(found[0].message.chars().count(), MAX_MESSAGE_CHARS);
    assert!(found[0].message.ends_with('…'));
    // A line over 64 KiB is skipped unread.
    let huge = format!(
        "src/a.c:1:1: {}\nsrc/b.c:2:2: short\n",
        "x".repeat(MAX_LINE_BYTES)
    );
    let found = parse_output(CommandKind::Build, &huge);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].file.as_deref(), Some("src/b.c"));
    let tests: String = (0..3_000)
        .map(|i| format!("test t{i} ... FAILED\n"))
        .collect();
    assert_eq!(parse_output(CommandKind::Test, &tests).len(), MAX_FAILURES);
}

/// xorshift64*: deterministic noise without a dependency.
struct Noise(u64);
impl Noise {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn garbage_never_panics() {
    const PIECES: &[&str] = &[
        "error[",
        "E0412",
        "]: ",
        "error: ",
        "warning: ",
        " --> ",
        "-->",
        ":",
        "::",
        "(",
        ")",
        ",",
        "'",
        "`",
        "\"",
        "{",
        "}",
        "[",
        "]",
        "\n",
        "\r",
        "\t",
        " ",
        "    ",
        "0",
        "12",
        "99999999999",
        "4294967296",
        "src/a.rs",
        "./x.go",
        "a.ts",
        "tests/t.py",
        "/abs/p.rs",
        "../up.rs",
        "C:\\w.rs",
        "test ",
        " ... FAILED",
        "thread '",
        "' (7) panicked at ",
        "panicked at '",
        "', ",
        "---- ",
        " stdout ----",
        "--- FAIL: ",
        "=== RUN   ",
        "FAILED ",
        "ERROR ",
        "ERROR collecting ",
        "____ ",
        "E   ",
        "): error TS",
        " - error TS",
        "error TS",
        "2305",
        "1185",
        "undefined reference to `",
        "unresolved import `crate::",
        "cannot find ",
        "has no field named",
        "\u{1b}[",
        "\u{1b}]",
        "\u{1b}",
        "é",
        "日本",
        "\u{202e}",
        "\u{0}",
        "{\"reason\":\"compiler-message\",\"message\":",
        "{\"level\":\"error\",\"spans\":",
        "{\"Action\":\"output\",\"Output\":\"",
        "null",
        "[[[[[[[[",
        "}}}}",
        "\\u0000",
        "…",
    ];
    let mut noise = Noise(0x9e37_79b9_7f4a_7c15);
    let kinds = [
        CommandKind::Build,
        CommandKind::Typecheck,
        CommandKind::Test,
    ];
    for round in 0..400 {
        let text = if round % 4 == 0 {
            let bytes: Vec<u8> = (0..noise.below(4_000))
                .map(|_| noise.next() as u8)
                .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        } else {
            (0..noise.below(600))
                .map(|_| PIECES[noise.below(PIECES.len())])
                .collect()
        };
        let root = ["/abs", "/", "", "relative", "/tmp/x/"][round % 5];
        let found = parse_output_in(kinds[round % 3], &text, Some(root));
        check_bounds(&found);
        let mut all = found;
        all.extend(markers_failures(&[
            ("../x".to_string(), 1),
            (text.chars().take(50).collect(), 2),
        ]));
        for g in classify_and_group(&all, MAX_FIX_GROUPS) {
            assert!(describe(&g).len() <= MAX_DESCRIPTION_BYTES);
            assert!(g.failures.len() <= MAX_GROUP_FAILURES);
        }
    }
    // Huge lines, deep JSON, broken JSON, lone escapes.
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let nested = format!(
        "{{\"reason\":\"compiler-message\",\"message\":{}1{}}}\n",
        "[".repeat(60_000),
        "]".repeat(60_000)
    );
    let weird_json = r#"{"reason":"compiler-message","message":{"level":"error","message":"cannot find type `X`","code":{"code":"E0412"},"spans":[{"file_name":7,"line_start":-1,"column_start":1e99,"is_primary":"yes"}]}}"#;
    for text in [
        "x".repeat(5 * MAX_LINE_BYTES),
        deep,
        nested,
        weird_json.to_string(),
        "{\"reason\":\"compiler-message\",\"message\":{\"level\":\"error\"".to_string(),
        "\u{1b}".to_string(),
        "\u{1b}[".to_string(),
        "\u{1b}]0;title".to_string(),
        "thread 'x' panicked at 'never closed\n".repeat(50),
        "--- FAIL: \n".to_string(),
        "test  ... FAILED\n".to_string(),
        "___\n_____\n__ x __\n".to_string(),
        "error[E0412]: cannot find type `Foo`".to_string(),
    ] {
        for kind in kinds {
            check_bounds(&parse_output(kind, &text));
        }
    }
}

fn check_bounds(found: &[Failure]) {
    assert!(
        !found.is_empty(),
        "a failed command always yields a failure"
    );
    assert!(found.len() <= MAX_FAILURES);
    for f in found {
        assert!(f.message.len() <= MAX_TAIL_BYTES.max(MAX_MESSAGE_CHARS * 4));
        assert!(
            !f.message
                .chars()
                .any(|c| (c.is_control() && c != '\n') || is_invisible(c)),
            "{f:?}"
        );
        for path in [&f.file, &f.related_file].into_iter().flatten() {
            assert!(
                !path.starts_with('/') && !path.split('/').any(|p| p == ".." || p.is_empty()),
                "{path}"
            );
        }
    }
}
