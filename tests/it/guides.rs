//! The guides in `docs/` are checked against the code, so that they cannot rot: every event
//! kind and field is in `docs/events.md`; every config block of `docs/providers.md` and
//! `docs/agents.md` loads as `submit` would load it, and is then used for real: its
//! provider answers `providers check` (a local server speaking that provider's wire
//! format) and its agent preset runs a task against a fake of its CLI.

use std::collections::BTreeMap;
use std::path::Path;

use flotilla_actors::protocol::{Event, EventKind, TaskId};

fn guide(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The guide's `### `name`` sections: heading name → the text up to the next heading.
fn sections(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    for line in text.lines() {
        if line.starts_with('#') {
            if let Some((name, body)) = current.take() {
                out.insert(name, body);
            }
            if let Some(name) = line
                .strip_prefix("### `")
                .and_then(|rest| rest.strip_suffix('`'))
            {
                current = Some((name.to_string(), String::new()));
            }
        } else if let Some((_, body)) = current.as_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    if let Some((name, body)) = current {
        out.insert(name, body);
    }
    out
}

#[test]
fn every_event_kind_and_each_of_its_fields_is_in_the_events_guide() {
    let text = guide("events.md");
    let documented = sections(&text);
    let samples = EventKind::samples(&TaskId::root(1));
    let mut missing = Vec::new();
    for kind in &samples {
        let name = kind.name();
        let Some(body) = documented.get(name) else {
            missing.push(format!("no section `### `{name}``"));
            continue;
        };
        let json = serde_json::to_value(kind).unwrap();
        if let Some(data) = json.get("data").and_then(|d| d.as_object()) {
            for field in data.keys() {
                if !body.contains(&format!("`{field}`")) {
                    missing.push(format!("{name}: field `{field}` is not described"));
                }
            }
        }
    }
    let kinds: Vec<&str> = samples.iter().map(EventKind::name).collect();
    for name in documented.keys() {
        if !kinds.contains(&name.as_str()) {
            missing.push(format!("`{name}` is described but is no event kind"));
        }
    }
    assert!(missing.is_empty(), "docs/events.md:\n{}", missing.join("\n"));
}

#[test]
fn the_events_guides_example_is_an_event_as_the_stream_sends_it() {
    let text = guide("events.md");
    let example = text
        .split("```json\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .expect("a json example")
        .to_string();
    let event: Result<Event, _> = serde_json::from_str(&example);
    let event = event.unwrap_or_else(|e| panic!("{e}: {example}"));
    assert_eq!(event.kind.name(), "task_added");
}
