//! The root planner's answer, as a model may write it: any bytes. Parsed as the Planner
//! actor parses it (`parse_json_answer::<PlannerOutput>`); a parsed batch then goes to a
//! fresh graph as the actor sends it (`PlannerAnswered`), and the graph's invariants hold.

#![no_main]

use flotilla_actors::config::Limits;
use flotilla_actors::graph::RunGraph;
use flotilla_actors::llm::output::{PlannerOutput, parse_json_answer};
use flotilla_actors::protocol::{PlannerAnswer, Usage};
use flotilla_fuzz::Watch;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let content = String::from_utf8_lossy(data);
    let limit = 256 * 1024;
    let parsed = parse_json_answer::<PlannerOutput>(&content, limit);
    // Parsing is deterministic and bounded: the same text, the same result; a smaller cap
    // refuses what is over it.
    assert_eq!(
        parsed.as_ref().map(|o| &o.tasks),
        parse_json_answer::<PlannerOutput>(&content, limit)
            .as_ref()
            .map(|o| &o.tasks)
    );
    if content.len() > 8 {
        assert!(parse_json_answer::<PlannerOutput>(&content, 8).is_err());
    }
    let mut g = RunGraph::new(Limits::default());
    let mut w = Watch::default();
    let answer = PlannerAnswer {
        call: 0,
        prompt: "plan".into(),
        content: content.into_owned(),
        usage: Usage::default(),
        tasks: parsed.map(|o| o.tasks),
    };
    let r = g.planner_answered(answer);
    w.after(&g, "planner_answered", r);
});
