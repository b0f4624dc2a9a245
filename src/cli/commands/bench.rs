//! `flotilla bench`: measures flotilla here, without a daemon.

use crate::cli::args::Command;
use crate::cli::error::{CliError, ErrorKind, Exit};
use crate::text_safety;

/// `flotilla bench`: runs on the calling thread, outside any async runtime (each run has
/// an actix system of its own).
pub fn run_bench(command: &Command) -> Result<Exit, CliError> {
    let Command::Bench {
        tasks,
        chain,
        scaling,
        workers,
        no_makespan,
        no_requests,
        memory_runs,
        json,
        landing,
        landing_files,
        landing_tasks,
        landing_workers,
        landing_gate,
        landing_repeat,
        landing_next_run,
        landing_dir,
        gate_timing,
        gate_candidates,
        gate_command,
    } = command
    else {
        unreachable!("run_bench is called for `flotilla bench` only");
    };
    let bench_dir = || {
        landing_dir
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join("flotilla-bench-landing"))
    };
    if let Some(project) = gate_timing {
        let options = crate::bench::gate_timing::GateTimingOptions {
            project: project.clone(),
            candidates: *gate_candidates as usize,
            command: gate_command.clone(),
            dir: bench_dir(),
        };
        return super::bench_landing::run_gate_timing(&options, *json);
    }
    if *landing {
        let sizes = |flag: &'static str, what: &'static str, text: &str, example: &str| {
            parse_sizes(flag, what, text).map_err(|e| {
                CliError::wrap(ErrorKind::User, e).hint(format!("e.g. {flag} {example}"))
            })
        };
        let options = super::bench_landing::LandingOptions {
            files: sizes(
                "--landing-files",
                "files",
                landing_files,
                "1000,10000,50000",
            )?,
            tasks: sizes("--landing-tasks", "tasks", landing_tasks, "100,500")?,
            workers: *landing_workers as usize,
            gate: landing_gate.clone(),
            repeat: *landing_repeat as usize,
            next_run: *landing_next_run,
            dir: bench_dir(),
            json: *json,
        };
        let mut out = std::io::stdout().lock();
        super::bench_landing::run(&options, &mut out)
            .map_err(|e| CliError::internal("the landing bench failed").because(e))?;
        return Ok(Exit::Ok);
    }
    let scaling = parse_sizes("--scaling", "tasks", scaling).map_err(|e| {
        CliError::wrap(ErrorKind::User, e)
            .hint("e.g. --scaling 1000,10000,50000, or --scaling none")
    })?;
    let options = crate::bench::BenchOptions {
        tasks: *tasks as usize,
        chain: *chain as usize,
        scaling,
        workers: *workers as usize,
        makespan: !no_makespan,
        requests: !no_requests,
        memory_runs: *memory_runs as usize,
        json: *json,
    };
    let mut out = std::io::stdout().lock();
    crate::bench::run(&options, &mut out)
        .map_err(|e| CliError::internal("the bench failed").because(e))?;
    Ok(Exit::Ok)
}

/// A size in a list flag (`--scaling`, `--landing-files`, `--landing-tasks`) that is no
/// number from 1 to 1,000,000.
#[derive(Debug, thiserror::Error)]
#[error("{flag}: {part:?} is not a number of {what} from 1 to 1000000")]
pub struct BadSize {
    flag: &'static str,
    /// "tasks" or "files".
    what: &'static str,
    /// The part as typed, escaped.
    part: String,
}

/// "1000,10000" → [1000, 10000]; "none" or "" → [].
fn parse_sizes(flag: &'static str, what: &'static str, text: &str) -> Result<Vec<usize>, BadSize> {
    let text = text.trim();
    if text.is_empty() || text == "none" {
        return Ok(Vec::new());
    }
    text.split(',')
        .map(|part| {
            let part = part.trim();
            match part.parse::<usize>() {
                Ok(n) if (1..=1_000_000).contains(&n) => Ok(n),
                _ => Err(BadSize {
                    flag,
                    what,
                    part: text_safety::terminal_safe(part).into_owned(),
                }),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::BenchError;
    use crate::bench::makespan::{self, Workload};

    /// Issue 21 item 6: a bench failure reaches the CLI typed, as the `Caused by` line under
    /// "the bench failed" (its own cause, the distribution's error, is in that line's text
    /// and not said twice), exit 4.
    #[test]
    fn a_failed_bench_says_each_cause_on_its_line() {
        let bad = Workload {
            name: "bad".into(),
            tasks: 4,
            workers: 2,
            seed: 1,
            layers: 2,
            max_deps: 1,
            reach: 1,
            median_secs: 1.0,
            sigma: f64::NAN,
        };
        let e = BenchError::from(makespan::run(&bad).map(|_| ()).unwrap_err());
        let error = CliError::internal("the bench failed").because(e);
        assert_eq!(error.exit(), Exit::Failure);
        let report = error.report();
        let lines: Vec<&str> = report.lines().collect();
        assert_eq!(lines[0], "error: the bench failed", "{report}");
        assert!(
            lines[1].starts_with("Caused by: bad: durations: "),
            "{report}"
        );
        assert_eq!(lines.len(), 2, "{report}");
    }
}
