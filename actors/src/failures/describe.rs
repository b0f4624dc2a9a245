//! The helpers of [`describe`](super::describe): one failure as a line of a fix task, a
//! bounded list of files.

use super::*;

/// `a, b, c and 4 more`, escaped.
pub(super) fn list_files(files: &[String], max: usize) -> String {
    let mut shown: Vec<String> = files
        .iter()
        .take(max)
        .map(|f| truncate_chars(&escape_controls(f, false), 120))
        .collect();
    if files.len() > max {
        let last = format!(
            "{} and {} more",
            shown.pop().unwrap_or_default(),
            files.len() - max + 1
        );
        shown.push(last);
    }
    if shown.is_empty() {
        "the repository".to_string()
    } else {
        shown.join(", ")
    }
}

pub(super) fn describe_failure(f: &Failure) -> String {
    let esc = |s: &str, n: usize| truncate_chars(&escape_controls(s, false), n);
    let mut entry = String::from("- ");
    match &f.file {
        Some(file) => {
            entry.push_str(&esc(file, 200));
            if let Some(line) = f.line {
                let _ = write!(entry, ":{line}");
                if let Some(column) = f.column {
                    let _ = write!(entry, ":{column}");
                }
            }
        }
        None => entry.push_str("(no file)"),
    }
    if let Some(code) = &f.code {
        let _ = write!(entry, " {}", esc(code, 40));
    }
    if let Some(test) = &f.test {
        let _ = write!(entry, " test `{}`", esc(test, 200));
    }
    let mut lines = f.message.lines().map(str::trim).filter(|l| !l.is_empty());
    let _ = write!(
        entry,
        ": {}",
        esc(lines.next().unwrap_or(""), MAX_MESSAGE_CHARS)
    );
    for line in lines.take(MAX_MESSAGE_LINES * 2) {
        let _ = write!(entry, "\n    {}", esc(line, MAX_MESSAGE_CHARS));
    }
    if let Some(related) = &f.related_file {
        let _ = write!(entry, " (imports from {})", esc(related, 200));
    }
    entry.push('\n');
    // One failure may not take more than a third of the description.
    if entry.len() > MAX_DESCRIPTION_BYTES / 3 {
        truncate_bytes(&mut entry, MAX_DESCRIPTION_BYTES / 3 - 4);
        entry.push_str("…\n");
    }
    entry
}

#[cfg(test)]
#[path = "describe_tests.rs"]
mod tests;
