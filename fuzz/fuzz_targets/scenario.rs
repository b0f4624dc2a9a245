//! Scenario files (docs/scenarios.md), as a user may write them: any text. What parses
//! must go into the journal (as part of the run's `RunConfig`, JSON) and read back the same,
//! or a run could not resume.

#![no_main]

use flotilla::config::RunConfig;
use flotilla::scripted::Scenario;
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
});
