//! The daemon's log (ADR-024): every field and every message is escaped before it is
//! written, whoever wrote the text (a provider's error body, an agent's output, a path in
//! the user's repository). A log line is read on a terminal (`journalctl`, `tail -f`), so
//! a carriage return, a control sequence or a bidi override in it would act on that
//! terminal; tracing's default formatting passes `%display` fields and messages through
//! raw.
//!
//! - Human lines: [`SafeFields`] formats every field and the message through
//!   [`terminal_safe`] (field names and the level and target that tracing writes are
//!   flotilla's own).
//! - JSON lines: serde escapes C0 controls inside strings; [`JsonSafe`] also escapes DEL,
//!   C1 controls and the invisible formatting characters ([`json_safe`]), so the line
//!   stays the same JSON.

use std::fmt::{self, Debug};
use std::io;

use tracing::Subscriber;
use tracing::field::{Field, Visit};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FormatFields, MakeWriter};

use crate::text_safety::{json_safe, terminal_safe};

/// Formats an event's or a span's fields as tracing's default does (`message`, then
/// `name=value` pairs separated by spaces), each value escaped with [`terminal_safe`].
#[derive(Debug, Clone, Copy, Default)]
pub struct SafeFields;

impl<'writer> FormatFields<'writer> for SafeFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'writer>, fields: R) -> fmt::Result {
        let mut visitor = SafeVisitor {
            writer,
            first: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct SafeVisitor<'writer> {
    writer: Writer<'writer>,
    first: bool,
    result: fmt::Result,
}

impl SafeVisitor<'_> {
    fn emit(&mut self, field: &Field, text: &str) {
        // The `log` crate's metadata, as tracing's own formatter leaves it out.
        if self.result.is_err() || field.name().starts_with("log.") {
            return;
        }
        let separator = if std::mem::take(&mut self.first) {
            ""
        } else {
            " "
        };
        let text = terminal_safe(text);
        self.result = if field.name() == "message" {
            write!(self.writer, "{separator}{text}")
        } else {
            write!(self.writer, "{separator}{}={text}", field.name())
        };
    }
}

impl Visit for SafeVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.emit(field, value);
        } else {
            // Quoted, as tracing writes a string field.
            self.emit(field, &format!("{value:?}"));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        // `%display` fields and the message arrive here with their text as written.
        self.emit(field, &format!("{value:?}"));
    }
}

/// A writer whose JSON lines have every character a terminal could act on escaped as
/// `\uXXXX` (the same JSON).
#[derive(Debug, Clone)]
pub struct JsonSafe<M>(pub M);

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for JsonSafe<M> {
    type Writer = JsonSafeWriter<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        JsonSafeWriter(self.0.make_writer())
    }
}

pub struct JsonSafeWriter<W>(W);

impl<W: io::Write> io::Write for JsonSafeWriter<W> {
    /// tracing writes each formatted line in one call.
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        self.0.write_all(json_safe(&text).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

/// The daemon's human log: `filter`ed, written to `writer`, every field escaped.
pub fn human<W>(writer: W, filter: EnvFilter, ansi: bool) -> impl Subscriber + Send + Sync
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(ansi)
        .fmt_fields(SafeFields)
        .finish()
}

/// The daemon's JSON log (`--log-format json`): one JSON object a line, every string
/// escaped for a terminal.
pub fn json<W>(writer: W, filter: EnvFilter) -> impl Subscriber + Send + Sync
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(JsonSafe(writer))
        .json()
        .finish()
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buffer {
        type Writer = Buffer;
        fn make_writer(&'a self) -> Buffer {
            self.clone()
        }
    }

    impl Buffer {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    const HOSTILE: &str = "over\rwritten \u{1b}[2J cleared \u{202e}reversed\u{7}";

    /// What no log line may carry raw: CR, ESC, BEL, the bidi override.
    fn assert_inert(line: &str) {
        for c in ['\r', '\u{1b}', '\u{7}', '\u{202e}'] {
            assert!(!line.contains(c), "{c:?} raw in {line:?}");
        }
    }

    fn log_everything() {
        let span = tracing::info_span!("run", repo = %HOSTILE);
        let _entered = span.enter();
        tracing::warn!(
            detail = %HOSTILE,
            debugged = ?HOSTILE,
            quoted = HOSTILE,
            count = 3,
            "a provider said: {HOSTILE}"
        );
    }

    #[test]
    fn every_field_and_the_message_of_a_human_log_line_are_escaped() {
        let buffer = Buffer::default();
        let subscriber = human(buffer.clone(), EnvFilter::new("info"), false);
        tracing::subscriber::with_default(subscriber, log_everything);
        let text = buffer.text();
        assert_eq!(text.lines().count(), 1, "one line: {text:?}");
        assert_inert(&text);
        // The escapes show what was there.
        assert!(
            text.contains(r"a provider said: over\x0dwritten \x1b[2J cleared \u{202e}reversed"),
            "{text}"
        );
        assert!(text.contains(r"detail=over\x0dwritten \x1b[2J"), "{text}");
        assert!(text.contains("count=3"), "{text}");
        assert!(text.contains("repo=over"), "span fields too: {text}");
    }

    #[test]
    fn a_json_log_line_stays_json_with_every_character_escaped() {
        let buffer = Buffer::default();
        let subscriber = json(buffer.clone(), EnvFilter::new("info"));
        tracing::subscriber::with_default(subscriber, log_everything);
        let text = buffer.text();
        assert_inert(&text);
        let line: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
        assert_eq!(
            line["fields"]["message"],
            format!("a provider said: {HOSTILE}"),
            "the same JSON: {text}"
        );
        assert_eq!(line["fields"]["detail"], HOSTILE);
    }
}
