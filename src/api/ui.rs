//! `POST /v1/ui` (`flotilla ui`): a link that opens the live page in a browser.

use serde::{Deserialize, Serialize};

/// What `POST /v1/ui` takes: the run the page opens on (any unique prefix), if one.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenPage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
}

/// The answer: a loopback URL holding a one-time code, good once, for
/// [`PageLink::expires_in_secs`]; opening it gives the browser its session.
#[derive(Debug, Serialize, Deserialize)]
pub struct PageLink {
    pub url: String,
    pub expires_in_secs: u64,
}
