//! One file per command; [`run_client`] picks the one the command line names. `daemon`,
//! `bench` and `demo` run outside the client's runtime and are called by `main` directly.

pub mod bench;
pub mod bench_landing;
pub mod cancel;
pub mod completions;
pub mod config_check;
pub mod daemon;
pub mod decide;
pub mod demo;
pub mod doctor;
pub mod eval;
pub mod gc;
pub mod graph;
pub mod init;
pub mod log;
pub mod providers;
pub mod report;
pub mod runs;
pub mod status;
pub mod submit;
pub mod tail;
pub mod ui;

use super::args::{Cli, Command, ConfigAction, ProvidersAction};
use super::client::Client;
use super::error::{CliError, Exit};

/// Runs a client command (everything but `daemon` and `bench`).
pub async fn run_client(cli: &Cli) -> Result<Exit, CliError> {
    // These need no daemon.
    match &cli.command {
        Command::Completions { shell } => return completions::completions(*shell),
        Command::Man { out } => return completions::man(out.as_deref()),
        Command::Init { repo, force } => return init::run(repo, *force),
        Command::Config {
            action: ConfigAction::Check { file, repo },
        } => return config_check::run(file.as_deref(), repo),
        Command::Doctor {
            repo,
            config,
            timeout,
            ..
        } => return doctor::run(&cli.state_dir(), repo, config.as_deref(), *timeout).await,
        _ => {}
    }
    if let Command::Providers {
        action:
            ProvidersAction::Check {
                config,
                repo,
                timeout,
                json,
            },
    } = &cli.command
    {
        return providers::check(config.as_deref(), repo, *timeout, *json).await;
    }
    let client = Client::new(cli.endpoint()?);
    match &cli.command {
        Command::Daemon { .. } => unreachable!("the daemon is started by main"),
        Command::Bench { .. } => unreachable!("the bench is run by main, outside any runtime"),
        Command::Demo { .. } => unreachable!("the demo runs its daemon: main starts it"),
        Command::Providers { .. }
        | Command::Completions { .. }
        | Command::Man { .. }
        | Command::Init { .. }
        | Command::Config { .. }
        | Command::Doctor { .. } => {
            unreachable!("answered above, without the daemon")
        }
        Command::Submit {
            request,
            repo,
            config,
            detach,
            json,
            ..
        } => submit::submit(&client, request, repo, config.as_deref(), *detach, *json).await,
        Command::Tail {
            run, json, since, ..
        } => {
            let outcome = tail::follow(&client, run, *since, *json).await?;
            Ok(tail::exit_for(outcome))
        }
        Command::Status {
            run: Some(run),
            task: Some(task),
            json,
            ..
        } => status::task(&client, run, task, *json).await,
        Command::Status {
            run: Some(run),
            task: None,
            json,
            ..
        } => status::run(&client, run, *json).await,
        Command::Status {
            run: None, json, ..
        } => status::daemon(&client, *json).await,
        Command::Graph { run, format, .. } => graph::run(&client, run, *format).await,
        Command::Log {
            run,
            task,
            attempt,
            follow,
            json,
            ..
        } => log::run(&client, run, task, *attempt, *follow, *json).await,
        Command::Report { run, json, .. } => report::run(&client, run, *json).await,
        Command::Eval {
            dir,
            project,
            models,
            scripted,
            scripted_plan,
            work,
            json,
            ..
        } => {
            let models = match (models, scripted) {
                (Some(file), _) => eval::Models::From(file),
                (None, true) => eval::Models::Scripted,
                (None, false) => eval::Models::Project,
            };
            let planning = if *scripted_plan {
                eval::Planning::Scripted
            } else {
                eval::Planning::Models
            };
            eval::run(
                &client,
                dir,
                project,
                models,
                planning,
                work.as_deref(),
                *json,
            )
            .await
        }
        Command::Cancel { run, .. } => cancel::run(&client, run).await,
        Command::Gc { dry_run, json, .. } => gc::run(&client, *dry_run, *json).await,
        Command::Decide {
            run, adopt_main, ..
        } if *adopt_main => decide::adopt_main(&client, run).await,
        Command::Decide { run, cancel, .. } if *cancel => decide::cancel(&client, run).await,
        Command::Decide {
            run,
            task,
            accept,
            complete: _,
            fail,
            land,
            ..
        } => {
            let decision = decide::TaskDecision {
                accept: accept.as_deref(),
                fail: *fail,
                land: *land,
            };
            decide::task(&client, run, task.as_deref(), decision).await
        }
        Command::Runs { json, .. } => runs::run(&client, *json).await,
        Command::Ui { run, .. } => ui::run(&client, run.as_deref()).await,
    }
}
