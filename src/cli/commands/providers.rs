//! `flotilla providers check`: calls every configured model once, here, without a daemon.

use std::path::Path;
use std::time::Duration;

use crate::cli::emit;
use crate::cli::error::{CliError, ErrorKind, Exit};
use crate::cli::render::lists;
use crate::config::RunConfig;
use crate::providers::ProviderRegistry;
use crate::text_safety;

const CONFIG_HINT: &str = "see docs/configuration.md for [providers] and [roles]";

pub async fn check(
    config: Option<&Path>,
    repo: &Path,
    timeout: u64,
    json: bool,
) -> Result<Exit, CliError> {
    let path = config
        .map(Path::to_path_buf)
        .unwrap_or_else(|| repo.join("flotilla.toml"));
    let models = RunConfig::load_models(&path)
        .map_err(|e| CliError::wrap(ErrorKind::Config, e).hint(CONFIG_HINT))?;
    if models.roles == Default::default() {
        return Err(CliError::config(format!(
            "{} configures no [roles]: every role is scripted",
            path.display()
        ))
        .hint(CONFIG_HINT));
    }
    let registry = ProviderRegistry::new()
        .map_err(|e| CliError::internal("cannot set up the HTTP client").because(e))?;
    let results = registry
        .check(&models, Duration::from_secs(timeout.max(1)))
        .await;
    if json {
        for result in &results {
            emit(&format!("{}\n", text_safety::json_line(result)))?;
        }
    } else {
        emit(&lists::provider_checks_text(&results))?;
    }
    Ok(if results.iter().all(|r| r.reachable) {
        Exit::Ok
    } else {
        Exit::Failure
    })
}
