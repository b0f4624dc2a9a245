//! The agents a worker profile can run (ADR-009): the built-in tool-using agent over any
//! provider ([`builtin`]), with its tools ([`tools`]). The scripted agent lives with the
//! scripted provider (`crate::scripted`).

pub mod builtin;
pub mod command;
pub mod tools;
