//! `flotilla.toml`, as a user may write it: any text. What parses has limits a run can use
//! (a graph and its invariants work with them) and goes into the journal (as part of the
//! run's `RunConfig`, JSON) and reads back the same.

#![no_main]

use flotilla::config::{FileConfig, RunConfig};
use flotilla_actors::graph::RunGraph;
use flotilla_actors::protocol::TaskSpec;
use flotilla_fuzz::Watch;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(file) = FileConfig::parse(text) else {
        return;
    };
    let config = RunConfig {
        limits: file.limits.clone(),
        planner: file.planner.clone(),
        workers: file.workers.clone(),
        models: file.models(),
        ..RunConfig::default()
    };
    // What parses is a config a run accepts (submission checks it again).
    config
        .models
        .validate()
        .expect("parsed provider settings validate");
    assert!(!config.profiles().is_empty());
    let json = serde_json::to_string(&config).expect("a parsed config serializes");
    let back: RunConfig = serde_json::from_str(&json)
        .unwrap_or_else(|e| panic!("the journaled config does not read back: {e}\n{json}"));
    assert_eq!(back, config, "the config changes through the journal");
    back.limits.validate().expect("journaled limits validate");
    // A run can start with these limits.
    let mut g = RunGraph::new(back.limits);
    let mut w = Watch::default();
    let r = g.submit(vec![TaskSpec::new("a task", &["src"])]);
    w.after(&g, "submit", r);
});
