use strutil::{capitalize, is_palindrome, reverse_words};

#[test]
fn reverses_words_and_collapses_whitespace() {
    assert_eq!(reverse_words("  the quick  fox "), "fox quick the");
}

#[test]
fn a_blank_string_has_no_words() {
    assert_eq!(reverse_words(" \t "), "");
}

#[test]
fn a_palindrome_ignores_case_and_punctuation() {
    assert!(is_palindrome("A man, a plan, a canal: Panama"));
    assert!(is_palindrome(""));
}

#[test]
fn a_word_that_is_not_a_palindrome_is_not() {
    assert!(!is_palindrome("flotilla"));
}

#[test]
fn capitalizes_each_word_and_keeps_whitespace() {
    assert_eq!(capitalize("hello wide  world"), "Hello Wide  World");
}
