//! A run's task graph exported for other tools: Graphviz DOT and a Mermaid flowchart
//! (`GET /v1/runs/{id}/graph?format=dot|mermaid`, `flotilla graph`). Labels are task
//! descriptions, a model's text: escaped for the terminal ([`terminal_safe`]) and for the
//! format, so that no description can add a statement to the graph.
//!
//! Knows only the wire snapshot ([`GraphSnapshot`]); nothing of the daemon or the CLI.

use std::fmt::Write as _;

use flotilla_actors::protocol::GraphSnapshot;

use crate::api::status::task_state_words;
use crate::text_safety::terminal_safe;

/// A task description cut to a label's length, on one line, with control characters
/// shown as escapes ([`terminal_safe`]): the start of every label in either export.
fn label_text(description: &str) -> String {
    let one_line = description.split_whitespace().collect::<Vec<_>>().join(" ");
    let short: String = one_line.chars().take(60).collect();
    terminal_safe(&short).into_owned()
}

/// A label inside a DOT double-quoted string: backslashes and quotes escaped, so that the
/// text (including the backslashes of [`terminal_safe`]'s escapes) shows as written.
fn dot_label(description: &str) -> String {
    label_text(description)
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
}

/// A label inside a Mermaid `["..."]` node: the characters Mermaid treats specially there
/// become its `#code;` entities.
fn mermaid_label(description: &str) -> String {
    let mut out = String::new();
    for c in label_text(description).chars() {
        match c {
            '"' | '#' | '&' | '<' | '>' | '`' | ';' => {
                let _ = write!(out, "#{};", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// Graphviz: dependency edges solid, subtask edges dashed.
pub fn dot(graph: &GraphSnapshot) -> String {
    let mut out = String::from("digraph flotilla {\n  rankdir=LR;\n  node [shape=box];\n");
    for t in &graph.tasks {
        let _ = writeln!(
            out,
            "  \"{}\" [label=\"{} [{}]\\n{}\"];",
            t.id,
            t.id,
            task_state_words(t.state),
            dot_label(&t.description)
        );
    }
    for t in &graph.tasks {
        for d in &t.depends_on {
            let _ = writeln!(out, "  \"{d}\" -> \"{}\";", t.id);
        }
        if let Some(p) = &t.parent {
            let _ = writeln!(
                out,
                "  \"{}\" -> \"{p}\" [style=dashed, label=\"subtask of\"];",
                t.id
            );
        }
    }
    out.push_str("}\n");
    out
}

/// Mermaid flowchart: dependency edges solid, subtask edges dotted.
pub fn mermaid(graph: &GraphSnapshot) -> String {
    let node = |id: &str| id.replace('.', "_");
    let mut out = String::from("flowchart LR\n");
    for t in &graph.tasks {
        let id = t.id.to_string();
        let _ = writeln!(
            out,
            "  {}[\"{} ({}): {}\"]",
            node(&id),
            id,
            task_state_words(t.state),
            mermaid_label(&t.description)
        );
    }
    for t in &graph.tasks {
        let id = t.id.to_string();
        for d in &t.depends_on {
            let _ = writeln!(out, "  {} --> {}", node(&d.to_string()), node(&id));
        }
        if let Some(p) = &t.parent {
            let _ = writeln!(out, "  {} -.-> {}", node(&id), node(&p.to_string()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use flotilla_actors::protocol::{Budget, Priority, TaskId, TaskState, TaskView};

    use super::*;

    fn graph(description: &str) -> GraphSnapshot {
        let view = |id: TaskId, depends_on| TaskView {
            id,
            state: TaskState::Running,
            attempt: 1,
            description: description.into(),
            scope: vec![],
            priority: Priority::default(),
            parent: None,
            depends_on,
            budget: Budget::default(),
            spent: Budget::default(),
            summary: None,
            failure: None,
            review: None,
        };
        GraphSnapshot {
            tasks: vec![
                view(TaskId::root(1), vec![]),
                view(TaskId::root(2), vec![TaskId::root(1)]),
            ],
            planning_finished: false,
            outcome: None,
            run_spent: Budget::default(),
            run_budget: Budget::default(),
            finish_reason: None,
        }
    }

    const HOSTILE: &str = "x\x1b]52;c;ZXZpbA==\x07\u{202e}\"];\n  evil -> t1 [\\\"<b>#&`";

    #[test]
    fn dot_labels_cannot_break_out_of_their_string_or_reach_the_terminal() {
        let dot = dot(&graph(HOSTILE));
        assert!(!dot.chars().any(|c| c.is_control() && c != '\n'), "{dot:?}");
        assert!(!dot.contains('\u{202e}'), "{dot}");
        // Two nodes, one edge: the description added no statement.
        assert_eq!(
            dot.lines().filter(|l| l.contains("[label=")).count(),
            2,
            "{dot}"
        );
        let edges = dot
            .lines()
            .filter(|l| l.trim_start().starts_with("\"t1\" ->"));
        assert_eq!(edges.count(), 1, "{dot}");
        let label = dot.lines().find(|l| l.contains("\"t1\" [label=")).unwrap();
        assert!(
            label.contains(r#"x\\x1b]52;c;ZXZpbA==\\x07\\u{202e}\"];"#),
            "{label}"
        );
        assert!(label.ends_with("\"];"), "{label}");
    }

    #[test]
    fn mermaid_labels_cannot_break_out_of_their_node_or_reach_the_terminal() {
        let text = mermaid(&graph(HOSTILE));
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "{text:?}"
        );
        assert!(!text.contains('\u{202e}'), "{text}");
        assert_eq!(text.lines().count(), 4, "{text}");
        let node = text
            .lines()
            .find(|l| l.trim_start().starts_with("t1["))
            .unwrap();
        assert_eq!(node.matches('"').count(), 2, "{node}");
        assert!(node.contains("#34;]#59; evil -#62; t1"), "{node}");
        assert!(node.contains("\\x1b]52"), "{node}");
    }
}
