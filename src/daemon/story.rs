//! A task's whole story (`flotilla status RUN TASK`): every journaled event of the run that
//! names the task — its attempts, the reasons they failed in full, its handoff and
//! findings, its branch, its landing, and the fix tasks made for it.
//!
//! Also served as `GET /v1/runs/{id}/tasks/{task}`. Events are read from their wire form, so
//! new event kinds are covered; bounded to the newest 2,000.

use flotilla_actors::protocol::{Event, EventKind, TaskId};

use crate::api::status::TaskStory;

/// The most events one story carries (the newest are kept): a task retried and re-landed
/// many times still answers in bounded time and size.
pub const MAX_STORY_EVENTS: usize = 2_000;

/// The events of `events` that are about `task`, the newest [`MAX_STORY_EVENTS`] of them.
pub fn story(run: String, task: TaskId, events: Vec<Event>) -> TaskStory {
    let id = task.to_string();
    let mut about: Vec<Event> = events
        .into_iter()
        .filter(|e| names_task(&e.kind, &id))
        .collect();
    let omitted = about.len().saturating_sub(MAX_STORY_EVENTS);
    about.drain(..omitted);
    TaskStory {
        run,
        task,
        events: about,
        omitted,
    }
}

/// Whether an event is about the task `id`: it names it as the task, parent, subtask or
/// fix target of what happened (anywhere in its data), not merely as a dependency or in a
/// report. Read from the event's wire form, so new event kinds are covered as they come.
pub fn names_task(kind: &EventKind, id: &str) -> bool {
    let Ok(value) = serde_json::to_value(kind) else {
        return false;
    };
    value.get("data").is_some_and(|data| mentions(data, id))
}

/// Keys whose value is the task an event is about.
const SUBJECT_KEYS: [&str; 4] = ["task", "parent", "via", "subtask"];
/// Keys whose list holds the tasks an event is about.
const SUBJECT_LISTS: [&str; 2] = ["tasks", "subtasks"];
/// Keys that name other tasks only in passing.
const PASSING_KEYS: [&str; 2] = ["depends_on", "reported"];

fn mentions(value: &serde_json::Value, id: &str) -> bool {
    match value {
        serde_json::Value::Object(map) => map.iter().any(|(key, v)| {
            if SUBJECT_KEYS.contains(&key.as_str()) && v.as_str() == Some(id) {
                return true;
            }
            if SUBJECT_LISTS.contains(&key.as_str())
                && v.as_array()
                    .is_some_and(|list| list.iter().any(|t| t.as_str() == Some(id)))
            {
                return true;
            }
            !PASSING_KEYS.contains(&key.as_str())
                && (v.is_object() || v.is_array())
                && mentions(v, id)
        }),
        serde_json::Value::Array(items) => items.iter().any(|v| mentions(v, id)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sample_event_about_a_task_is_in_its_story_and_none_about_another() {
        let task: TaskId = "t3".parse().unwrap();
        let mut about = 0;
        for kind in EventKind::samples(&task) {
            let json = serde_json::to_value(&kind).unwrap();
            let data = &json["data"];
            if data["task"] == "t3" || data["parent"] == "t3" {
                about += 1;
                assert!(names_task(&kind, "t3"), "{}: {json}", kind.name());
            }
            assert!(
                !names_task(&kind, "t99"),
                "{} is not about t99: {json}",
                kind.name()
            );
        }
        assert!(about > 20, "the samples cover the task's events: {about}");
    }

    #[test]
    fn a_dependency_is_not_the_task_but_a_fix_for_it_is() {
        let kind: EventKind = serde_json::from_value(serde_json::json!({
            "kind": "task_ready", "data": {"task": "t5"}
        }))
        .unwrap();
        assert!(!names_task(&kind, "t3"));
        let added = EventKind::samples(&"t5".parse().unwrap())
            .into_iter()
            .find(|k| matches!(k, EventKind::TaskAdded { .. }))
            .unwrap();
        let mut json = serde_json::to_value(&added).unwrap();
        json["data"]["depends_on"] = serde_json::json!(["t3"]);
        let depends: EventKind = serde_json::from_value(json).unwrap();
        assert!(!names_task(&depends, "t3"), "t5 merely depends on t3");
        assert!(names_task(&depends, "t5"));
    }

    #[test]
    fn a_story_keeps_the_newest_events_past_its_bound() {
        let task: TaskId = "t1".parse().unwrap();
        let run = flotilla_actors::protocol::RunId::generate();
        let events: Vec<Event> = (1..=(MAX_STORY_EVENTS as u64 + 5))
            .map(|seq| Event {
                seq,
                run,
                at_ms: 0,
                kind: EventKind::TaskReady { task: task.clone() },
            })
            .collect();
        let story = story(run.to_string(), task, events);
        assert_eq!(story.omitted, 5);
        assert_eq!(story.events.len(), MAX_STORY_EVENTS);
        assert_eq!(story.events[0].seq, 6, "the oldest go first");
    }
}
