//! The daemon's credentials (ADR-015, issue 19 point 2): every variable of the daemon's
//! environment whose name looks like a credential is read into memory once, when the daemon
//! starts, and removed from the process's environment before any thread exists.
//!
//! What that buys: nothing the daemon starts later can inherit a key by mistake (a
//! `Command` that forgot `env_clear`, a library that spawns a helper with the ambient
//! environment), and nothing in the daemon reads a key from the environment by accident (a
//! log line of `std::env::vars()`). The keys are then handed out only where the
//! configuration asks for them by name: the provider client's request header
//! (`api_key_env`), and an external agent CLI's own key (`secrets = [...]` of a command
//! agent, passed on purpose).
//!
//! A held value is a [`Secret`]: it never prints (`Debug` says `[redacted]`, and there is no
//! `Display`), and its memory is zeroed when it is dropped.
//!
//! What this does not do: `/proc/PID/environ` shows the environment block the process was
//! started with, which `unsetenv` does not rewrite. That file is guarded by the daemon
//! being non-dumpable (`PR_SET_DUMPABLE` 0, set in `main` right after): the kernel then
//! refuses it to every process of the same user that lacks `CAP_SYS_PTRACE`.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt;
use std::sync::{Arc, OnceLock};

use flotilla_actors::ports::looks_secret;
use zeroize::Zeroizing;

/// A credential's value. It does not print, and its memory is zeroed when dropped.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Zeroizing<String>);

impl Secret {
    pub fn new(value: String) -> Self {
        Secret(Zeroizing::new(value))
    }

    /// The value, for the one place that sends it (a request header, a CLI's environment).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

/// The credentials the daemon holds, by variable name.
#[derive(Clone, Default)]
pub struct Keys {
    held: HashMap<String, Secret>,
}

impl fmt::Debug for Keys {
    /// The names only.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<&String> = self.held.keys().collect();
        names.sort();
        f.debug_struct("Keys").field("names", &names).finish()
    }
}

/// Whether the daemon holds the variable `name` as a credential rather than leaving it in
/// its environment: the words [`looks_secret`] looks for (`KEY`, `TOKEN`, `SECRET`, `AUTH`,
/// …). Every `api_key_env` a config may name ends in `_KEY` or `_TOKEN`, and every preset's
/// agent key does too. flotilla's own settings (`FLOTILLA_LOG`, `FLOTILLA_STATE_DIR`) are
/// not credentials and stay, unless a secret word is in the rest of the name.
pub fn is_held(name: &str) -> bool {
    let rest = match name.get(..8) {
        Some(prefix) if prefix.eq_ignore_ascii_case("FLOTILLA") => &name[8..],
        _ => name,
    };
    looks_secret(rest)
}

impl Keys {
    /// The credentials among `vars` (see [`is_held`]). A value that is not UTF-8 cannot go
    /// in a header or be a key: it is not held (a config naming it gets `MissingKey`).
    pub fn from_vars(vars: impl IntoIterator<Item = (OsString, OsString)>) -> Self {
        let held = vars
            .into_iter()
            .filter_map(|(name, value)| {
                let name = name.into_string().ok()?;
                if !is_held(&name) {
                    return None;
                }
                Some((name, Secret::new(value.into_string().ok()?)))
            })
            .collect();
        Keys { held }
    }

    /// The credential in the variable `name`, if the daemon's environment had it.
    pub fn get(&self, name: &str) -> Option<&Secret> {
        self.held.get(name)
    }

    /// The names held, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.held.keys().cloned().collect();
        names.sort();
        names
    }

    /// Takes the credentials out of this process's environment: reads them into a `Keys`
    /// and removes each variable held from the environment, so that no process started
    /// from now on inherits one and no later `std::env::var` finds one.
    ///
    /// # Safety
    ///
    /// The process must have one thread: no other thread may read or write the
    /// environment meanwhile (C's `getenv` is not synchronized with `unsetenv`). The daemon
    /// calls it first thing in `main`, before the tokio and actix runtimes (and the
    /// tracing subscriber) start any thread.
    pub unsafe fn take_from_environment() -> Self {
        let keys = Keys::from_vars(std::env::vars_os());
        let names: Vec<OsString> = std::env::vars_os()
            .map(|(name, _)| name)
            .filter(|name| name.to_str().is_none_or(is_held))
            .collect();
        for name in names {
            // SAFETY: the caller guarantees that this is the only thread.
            unsafe { std::env::remove_var(&name) };
        }
        keys
    }
}

/// The daemon's keys, once `main` took them from the environment.
static TAKEN: OnceLock<Arc<Keys>> = OnceLock::new();

/// Takes the daemon's credentials out of its environment (see
/// [`Keys::take_from_environment`]) and keeps them for [`daemon_keys`]. Returns the names
/// held, for the daemon's log.
///
/// # Safety
///
/// As [`Keys::take_from_environment`]: the process must have one thread.
pub unsafe fn take_daemon_keys() -> Vec<String> {
    // SAFETY: passed on from the caller.
    let keys = unsafe { Keys::take_from_environment() };
    let names = keys.names();
    let _ = TAKEN.set(Arc::new(keys));
    names
}

/// The credentials this process holds: those `main` took from the daemon's environment at
/// start, or, in a process that did not (the CLI's `providers check`, an in-process test),
/// those in the environment now, read without removing them.
pub fn daemon_keys() -> Arc<Keys> {
    match TAKEN.get() {
        Some(keys) => keys.clone(),
        None => Arc::new(Keys::from_vars(std::env::vars_os())),
    }
}

/// The daemon's environment as a command's environment is built from
/// ([`flotilla_actors::ports::scrubbed_env`]): what is left in the process's environment,
/// and the credentials held, which only a command agent's `secrets` list passes on.
pub fn command_environment() -> Vec<(String, String)> {
    let keys = daemon_keys();
    let mut env: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
        .filter(|(name, _)| keys.get(name).is_none())
        .collect();
    env.extend(
        keys.held
            .iter()
            .map(|(name, secret)| (name.clone(), secret.expose().to_string())),
    );
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_never_prints() {
        let secret = Secret::new("sk-unit-8c2f".into());
        assert_eq!(format!("{secret:?}"), "Secret([redacted])");
        let keys = Keys::from_vars([("OPENAI_API_KEY".into(), "sk-unit-8c2f".into())]);
        let shown = format!("{keys:?}");
        assert!(
            shown.contains("OPENAI_API_KEY") && !shown.contains("sk-unit"),
            "{shown}"
        );
        assert_eq!(keys.get("OPENAI_API_KEY").unwrap().expose(), "sk-unit-8c2f");
    }

    #[test]
    fn credentials_are_held_and_the_rest_left() {
        for held in [
            "OPENAI_API_KEY",
            "ANTHROPIC_API_KEY",
            "MY_LLM_TOKEN",
            "GITHUB_TOKEN",
            "AWS_SECRET_ACCESS_KEY",
            "SSH_AUTH_SOCK",
            "FLOTILLA_TEST_PROVIDERS_OPENAI_KEY",
        ] {
            assert!(is_held(held), "{held}");
        }
        for left in [
            "PATH",
            "HOME",
            "FLOTILLA_LOG",
            "FLOTILLA_STATE_DIR",
            "FAILPOINTS",
            "LANG",
            "F",
        ] {
            assert!(!is_held(left), "{left}");
        }
    }

    /// The variable that makes [`taken_in_a_process_of_its_own`] do its work: it runs in a
    /// copy of this test binary started by [`taking_the_keys_removes_them_from_the_environment`],
    /// alone, so that removing variables races no other thread.
    const CHILD: &str = "FLOTILLA_KEYS_UNIT_CHILD";
    const NAME: &str = "FLOTILLA_KEYS_UNIT_API_KEY";
    const VALUE: &str = "sk-unit-take-51d0";

    #[test]
    fn taken_in_a_process_of_its_own() {
        if std::env::var_os(CHILD).is_none() {
            return;
        }
        // SAFETY: this process runs this one test (`--exact`, one test thread), and nothing
        // else of it reads the environment meanwhile.
        let names = unsafe { take_daemon_keys() };
        assert!(names.iter().any(|n| n == NAME), "{names:?}");
        assert_eq!(daemon_keys().get(NAME).map(Secret::expose), Some(VALUE));
        assert!(std::env::var_os(NAME).is_none(), "still in the environment");
        assert!(std::env::vars_os().all(|(n, _)| n.to_str().is_none_or(|n| !is_held(n))));
        // What a process started with the ambient environment inherits.
        let out = std::process::Command::new("sh")
            .args(["-c", &format!("echo \"${{{NAME}-unset}}\"; env")])
            .output()
            .unwrap();
        let inherited = String::from_utf8_lossy(&out.stdout);
        assert!(inherited.starts_with("unset\n"), "{inherited}");
        assert!(!inherited.contains(VALUE), "{inherited}");
        assert!(inherited.contains("PATH="), "{inherited}");
        // A command agent that names it in `secrets` still gets it.
        assert!(
            command_environment()
                .iter()
                .any(|(n, v)| n == NAME && v == VALUE)
        );
        println!("TAKEN-OK");
    }

    /// The key is held, and after the take it is gone from the process's environment (what
    /// `std::env` reads, and what every process spawned from now on inherits).
    #[test]
    fn taking_the_keys_removes_them_from_the_environment() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "keys::tests::taken_in_a_process_of_its_own",
                "--test-threads=1",
                "--nocapture",
            ])
            .env(CHILD, "1")
            .env(NAME, VALUE)
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{said}");
        assert!(said.contains("TAKEN-OK"), "the check ran: {said}");
    }
}
