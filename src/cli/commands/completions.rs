//! `flotilla completions SHELL` and `flotilla man`: both generated from the clap definitions
//! in `args`, so a new flag shows up in them without anyone remembering to.

use std::path::Path;

use clap::CommandFactory;
use clap_complete::Shell;

use crate::cli::args::Cli;
use crate::cli::emit;
use crate::cli::error::{CliError, Exit};

/// The name the scripts complete: the binary's, not whatever path it was run by.
const BIN: &str = "flotilla";

/// Prints the completion script for `shell`.
pub fn completions(shell: Shell) -> Result<Exit, CliError> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), BIN, &mut script);
    emit(&String::from_utf8_lossy(&script))?;
    Ok(Exit::Ok)
}

/// Prints flotilla(1), or with `out`, writes it and one page per command (flotilla-submit.1,
/// flotilla-providers-check.1, …) into that directory.
pub fn man(out: Option<&Path>) -> Result<Exit, CliError> {
    let command = Cli::command();
    match out {
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(command)
                .render(&mut page)
                .map_err(|e| CliError::internal("cannot render the manual page").because(e))?;
            emit(&String::from_utf8_lossy(&page))?;
        }
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| {
                CliError::user(format!("cannot create {}", dir.display())).because(e)
            })?;
            clap_mangen::generate_to(command, dir).map_err(|e| {
                CliError::user(format!(
                    "cannot write the manual pages into {}",
                    dir.display()
                ))
                .because(e)
            })?;
        }
    }
    Ok(Exit::Ok)
}
