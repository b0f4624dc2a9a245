//! The `flotilla` command line.

use clap::Parser;

/// flotilla orchestrates many LLM coding agents on one git repository.
#[derive(Debug, Parser)]
#[command(name = "flotilla", version, about)]
struct Cli {}

fn main() {
    let _cli = Cli::parse();
    println!("flotilla {}: the daemon and CLI arrive with M2; see README.md", env!("CARGO_PKG_VERSION"));
}
