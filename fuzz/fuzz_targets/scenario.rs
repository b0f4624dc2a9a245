//! Scenario files (docs/scenarios.md), as a user may write them: any text. What parses
//! must go into the journal (as part of the run's `RunConfig`, JSON) and read back the same,
//! or a run could not resume. Its planner answers then go, as the scripted provider writes
//! them, through the planner's parser into a graph, whose invariants must hold.

#![no_main]

use flotilla::config::RunConfig;
use flotilla::scripted::{PlannerFault, Scenario};
use flotilla_actors::config::Limits;
use flotilla_actors::graph::RunGraph;
use flotilla_actors::llm::output::{PlannerOutput, parse_json_answer};
use flotilla_actors::protocol::{PlannerAnswer, Usage};
use flotilla_fuzz::Watch;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(scenario) = Scenario::from_toml(text) else {
        return;
    };
    let config = RunConfig {
        scenario,
        ..RunConfig::default()
    };
    let json = serde_json::to_string(&config).expect("a parsed scenario serializes");
    let back: RunConfig = serde_json::from_str(&json)
        .unwrap_or_else(|e| panic!("the journaled scenario does not read back: {e}\n{json}"));
    back.scenario
        .check()
        .expect("the journaled scenario checks");
    assert_eq!(back, config, "the scenario changes through the journal");

    let mut g = RunGraph::new(Limits::default());
    let mut w = Watch::default();
    for (call, step) in back.scenario.planner.answers.iter().enumerate().take(8) {
        // As ScriptedLlm answers (a provider error never reaches the graph).
        let content = match (step.fault, &step.content, &step.tasks) {
            (Some(PlannerFault::Error), _, _) => continue,
            (Some(PlannerFault::Malformed), _, _) => "{".to_string(),
            (None, Some(content), _) => content.clone(),
            (None, None, tasks) => serde_json::json!({
                "scratchpad": "s",
                "tasks": tasks.clone().unwrap_or_default(),
            })
            .to_string(),
        };
        let tasks = parse_json_answer::<PlannerOutput>(&content, 256 * 1024).map(|o| o.tasks);
        let answer = PlannerAnswer {
            call: call as u32,
            prompt: String::new(),
            content,
            usage: Usage::default(),
            tasks,
        };
        let r = g.planner_answered(answer);
        w.after(&g, "planner_answered", r);
    }
});
