//! tsc: plain `file(line,col): error TS…` and pretty `file:line:col - error TS…` output,
//! with the import chain a missing export names.

use super::*;

impl Parser {
    pub(super) fn tsc(&mut self, line: &str) -> bool {
        // src/a.ts(3,5): error TS2304: Cannot find name 'Foo'.
        if let Some(pos) = line.find("): error TS") {
            let head = &line[..pos];
            if let Some(open) = head.rfind('(') {
                let (path, numbers) = (&head[..open], &head[open + 1..]);
                let mut numbers = numbers.split(',').map(|n| n.trim().parse::<u32>().ok());
                let (l, c) = (numbers.next().flatten(), numbers.next().flatten());
                if let (Some(l), false) = (l, path.trim().is_empty())
                    && let Some((code, message)) = ts_code(&line[pos + "): error TS".len()..])
                {
                    self.push_ts(Some(path.trim()), Some(l), c, code, message);
                    return true;
                }
            }
        }
        // src/a.ts:3:5 - error TS2304: Cannot find name 'Foo'.
        if let Some(loc) = parse_loc(line)
            && loc.sep == Sep::Space
            && let Some(rest) = loc.rest.strip_prefix("- error TS")
            && let Some((code, message)) = ts_code(rest)
        {
            self.push_ts(Some(loc.path), Some(loc.line), loc.column, code, message);
            return true;
        }
        // error TS5083: Cannot read file 'tsconfig.json'.
        if let Some(rest) = line.strip_prefix("error TS")
            && let Some((code, message)) = ts_code(rest)
        {
            self.push_ts(None, None, None, code, message);
            return true;
        }
        false
    }

    pub(super) fn push_ts(
        &mut self,
        path: Option<&str>,
        line: Option<u32>,
        column: Option<u32>,
        code: u32,
        message: &str,
    ) {
        let file = path.and_then(|p| self.path(p));
        let class = if code == 1185 || message.contains("Merge conflict marker") {
            FailureClass::ConflictMarkers
        } else if (1000..2000).contains(&code)
            || (5000..6000).contains(&code)
            || file.as_deref().is_some_and(is_manifest)
        {
            // TS1xxx are syntax errors, TS5xxx configuration errors: nothing type-checks.
            FailureClass::Build
        } else {
            FailureClass::Compile
        };
        let (symbol, module) = ts_symbol_and_module(code, message);
        let related_file = match (module, file.as_deref()) {
            (Some(module), Some(file)) => ts_module_file(file, module),
            _ => None,
        };
        let mut failure = Failure::new(class, self.text(message));
        failure.file = file;
        failure.line = line;
        failure.column = column;
        failure.code = Some(format!("TS{code}"));
        failure.symbol = symbol;
        failure.related_file = related_file;
        self.push(failure);
    }
}

/// `TS2304: message` → (2304, message).
pub(in crate::failures) fn ts_code(s: &str) -> Option<(u32, &str)> {
    let (code, rest) = leading_number(s)?;
    Some((code, rest.strip_prefix(':')?.trim()))
}

/// The name and, for an import chain, the module specifier of a tsc message.
pub(in crate::failures) fn ts_symbol_and_module(
    code: u32,
    message: &str,
) -> (Option<String>, Option<&str>) {
    let q = single_quoted(message);
    let module = |i: usize| q.get(i).map(|m| m.trim_matches('"'));
    let symbol = |i: usize| q.get(i).and_then(|s| clean_symbol(s));
    match code {
        // Module '"./b"' has no exported member 'Foo' / declares 'Foo' locally.
        2305 | 2614 | 2724 | 2459 => (symbol(1), module(0)),
        // Cannot find module './b'.
        2307 => (None, module(0)),
        // Cannot find name 'Foo'; Property 'x' does not exist / is missing; 'Foo' only
        // refers to a type; Cannot find namespace 'N'.
        2304 | 2552 | 2503 | 2339 | 2551 | 2741 | 2693 => (symbol(0), None),
        _ => (None, None),
    }
}

/// `'./b'` imported by `src/a.ts` → `src/b.ts` (a `.js` specifier names its `.ts`
/// source). Bare specifiers (packages) and paths leaving the repository give `None`.
pub(in crate::failures) fn ts_module_file(importing: &str, specifier: &str) -> Option<String> {
    if !(specifier.starts_with("./") || specifier.starts_with("../")) {
        return None;
    }
    let mut parts: Vec<&str> = importing.split('/').collect();
    parts.pop();
    for segment in specifier.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            s => parts.push(s),
        }
    }
    let last = parts.pop()?;
    let file = if [".ts", ".tsx", ".mts", ".cts"]
        .iter()
        .any(|e| last.ends_with(e))
    {
        last.to_string()
    } else if let Some(stem) = last.strip_suffix(".js") {
        format!("{stem}.ts")
    } else if let Some(stem) = last.strip_suffix(".jsx") {
        format!("{stem}.tsx")
    } else if let Some(stem) = last.strip_suffix(".mjs") {
        format!("{stem}.mts")
    } else if let Some(stem) = last.strip_suffix(".cjs") {
        format!("{stem}.cts")
    } else {
        format!("{last}.ts")
    };
    parts.push(&file);
    normalize_path(&parts.join("/"), None)
}

#[cfg(test)]
#[path = "tsc_tests.rs"]
mod tests;
