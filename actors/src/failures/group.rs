//! The helpers of [`classify_and_group`](super::classify_and_group): the keys that tie failures
//! together, a group's cause, title and stable signature.

use super::*;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Key {
    Symbol(String),
    Related(String),
    FileCause(String, String),
    File(String),
    Unlocated,
}

/// What ties a group together, from the strongest tie to the weakest.
pub(super) enum Cause {
    Symbol(String),
    Imports(Vec<String>),
    Code(String, String),
    Message(String),
    File(String),
    Unlocated(String),
}

pub(super) fn group_keys(class: FailureClass, f: &Failure) -> Vec<Key> {
    let by_file = || f.file.clone().map_or(Key::Unlocated, Key::File);
    match class {
        // A test file's failures are one task; so are a file's conflict markers.
        FailureClass::Test | FailureClass::ConflictMarkers => vec![by_file()],
        FailureClass::Build | FailureClass::Compile => {
            let mut keys = Vec::new();
            if let Some(symbol) = &f.symbol {
                keys.push(Key::Symbol(symbol.clone()));
            }
            if let Some(related) = &f.related_file {
                keys.push(Key::Related(related.clone()));
            }
            if keys.is_empty() {
                keys.push(match &f.file {
                    Some(file) => Key::FileCause(
                        file.clone(),
                        f.code
                            .clone()
                            .unwrap_or_else(|| first_line(&f.message).to_string()),
                    ),
                    None => Key::Unlocated,
                });
            }
            keys
        }
    }
}

pub(super) fn find(parent: &mut [usize], mut i: usize) -> usize {
    while parent[i] != i {
        parent[i] = parent[parent[i]];
        i = parent[i];
    }
    i
}

pub(super) fn union(parent: &mut [usize], a: usize, b: usize) {
    let (ra, rb) = (find(parent, a), find(parent, b));
    if ra != rb {
        // The smaller index is the root: deterministic.
        let (lo, hi) = if ra < rb { (ra, rb) } else { (rb, ra) };
        parent[hi] = lo;
    }
}

pub(super) fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("").trim()
}

pub(super) fn group_cause(class: FailureClass, scope: &[String], members: &[Failure]) -> Cause {
    if scope.is_empty() {
        let first = members.first().map_or("", |f| first_line(&f.message));
        return Cause::Unlocated(first.to_string());
    }
    if matches!(class, FailureClass::Test | FailureClass::ConflictMarkers) {
        let file = members.iter().find_map(|f| f.file.clone());
        return Cause::File(file.unwrap_or_else(|| scope[0].clone()));
    }
    let mut symbols: BTreeMap<&str, usize> = BTreeMap::new();
    for f in members {
        if let Some(s) = &f.symbol {
            *symbols.entry(s.as_str()).or_default() += 1;
        }
    }
    // The most frequent symbol; on a tie the first in order.
    let mut best: Option<(&str, usize)> = None;
    for (symbol, count) in symbols {
        if best.is_none_or(|(_, c)| count > c) {
            best = Some((symbol, count));
        }
    }
    if let Some((symbol, _)) = best {
        return Cause::Symbol(symbol.to_string());
    }
    let related: BTreeSet<String> = members
        .iter()
        .filter_map(|f| f.related_file.clone())
        .collect();
    if !related.is_empty() {
        return Cause::Imports(related.into_iter().collect());
    }
    let first = &members[0];
    match &first.code {
        Some(code) if members.iter().all(|f| f.code.as_ref() == Some(code)) => {
            Cause::Code(code.clone(), first_line(&first.message).to_string())
        }
        _ => Cause::Message(first_line(&first.message).to_string()),
    }
}

pub(super) fn build_group(
    class: FailureClass,
    scope: Vec<String>,
    members: Vec<Failure>,
) -> FixGroup {
    let cause = group_cause(class, &scope, &members);
    let total = members.len();
    let plural = total > 1;
    let noun = class.noun(plural);
    let files = list_files(&scope, 3);
    let short = |s: &str, n: usize| truncate_chars(&escape_controls(s, false), n);
    let (cause_text, cause_key, title) = match &cause {
        Cause::Symbol(symbol) => {
            let text = format!("`{}`", short(symbol, 120));
            let title = format!("Fix {noun} about {text} in {files}");
            (text, format!("symbol:{symbol}"), title)
        }
        Cause::Imports(related) => {
            let text = format!("imports from {}", list_files(related, 3));
            let title = format!("Fix {noun} about {text} in {files}");
            (text, format!("imports:{}", related.join("\n")), title)
        }
        Cause::Code(code, message) => {
            let title = format!(
                "Fix {noun} {} ({}) in {files}",
                short(code, 40),
                short(message, 80)
            );
            (short(code, 40), format!("code:{code}"), title)
        }
        Cause::Message(message) => {
            let title = format!("Fix {noun} in {files}: {}", short(message, 80));
            (
                short(message, 120),
                format!("message:{}", digits_masked(message)),
                title,
            )
        }
        Cause::File(file) => {
            let title = match class {
                FailureClass::ConflictMarkers => {
                    format!("Resolve merge conflict markers in {files}")
                }
                _ => format!("Fix {noun} in {files}"),
            };
            (short(file, 200), format!("file:{file}"), title)
        }
        Cause::Unlocated(message) => {
            let title = format!(
                "Fix {noun} reported without a file location: {}",
                short(message, 80)
            );
            (
                "no file location".to_string(),
                "unlocated".to_string(),
                title,
            )
        }
    };
    let hashed = format!("{}\n{cause_key}\n{}", class.slug(), scope.join("\n"));
    FixGroup {
        class,
        failures: members.into_iter().take(MAX_GROUP_FAILURES).collect(),
        failures_total: total,
        cause: cause_text,
        signature: format!("{}-{:016x}", class.slug(), fnv1a64(hashed.as_bytes())),
        title: truncate_chars(&title, 240),
        scope,
    }
}

/// Digit runs as `#`: a message cause that names a count or position must not change the
/// signature when only the number moves.
pub(super) fn digits_masked(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut in_digits = false;
    for c in s.chars() {
        if c.is_ascii_digit() {
            if !in_digits {
                out.push('#');
            }
            in_digits = true;
        } else {
            in_digits = false;
            out.push(c);
        }
    }
    out
}

/// FNV-1a: stable across Rust versions and platforms (std's hasher promises neither), so a
/// journaled signature still matches after an upgrade.
pub(super) fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
#[path = "group_tests.rs"]
mod tests;
