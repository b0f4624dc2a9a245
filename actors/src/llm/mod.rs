//! What every actor that calls a model shares: parsing its untrusted answers ([`output`]),
//! live progress notices of streaming calls ([`progress`]), the wait after a failed call
//! ([`backoff`]), what one request may carry ([`conversation`], ADR-030; the planner
//! roles' limits: [`limits`]), and the planners'
//! read-only tools with the loop that runs them ([`read_tools`], [`tool_loop`], ADR-037). No
//! actor lives here, and nothing here knows which actor calls it.

pub mod backoff;
pub mod conversation;
pub mod limits;
pub mod output;
pub mod progress;
pub mod read_tools;
pub mod tool_loop;
