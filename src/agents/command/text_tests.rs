use super::*;

#[test]
fn the_last_output_is_bounded_and_keeps_both_streams() {
    assert_eq!(last_output("", " "), "(none)");
    assert_eq!(last_output("out\n", ""), "out");
    let long_out = "o".repeat(5_000);
    let long_err = "e".repeat(5_000);
    let both = last_output(&long_out, &long_err);
    assert!(both.chars().count() <= TAIL_CHARS, "{}", both.len());
    assert!(both.contains("[stderr] eee") && both.contains("[stdout] ooo"));
    let short_err = last_output(&long_out, "fatal: no key");
    assert!(short_err.starts_with("[stderr] fatal: no key\n[stdout] "));
    assert!(short_err.chars().count() <= TAIL_CHARS);
    assert!(
        short_err.chars().count() > TAIL_CHARS - 50,
        "stdout gets what stderr leaves"
    );
}
