//! Colour for the CLI's output, with `anstyle`'s styles: only on a terminal, never with
//! `NO_COLOR`. The live line's redraw (`\r` and erase-line) is cursor control, not colour,
//! and is written by whoever redraws it ([`CLEAR_LINE`]).

use std::io::IsTerminal;

use anstyle::{AnsiColor, Effects};

/// Back to the start of the line and erase it: the live line is redrawn in place.
pub const CLEAR_LINE: &str = "\r\x1b[2K";

const GOOD: anstyle::Style = AnsiColor::Green.on_default();
const BAD: anstyle::Style = AnsiColor::Red.on_default();
const DIM: anstyle::Style = anstyle::Style::new().effects(Effects::DIMMED);
const BOLD: anstyle::Style = anstyle::Style::new().effects(Effects::BOLD);

#[derive(Debug, Clone, Copy)]
pub struct Style {
    pub color: bool,
    pub live: bool,
}

impl Style {
    /// Colour and the live line on a terminal; colour off when `NO_COLOR` is set.
    pub fn detect() -> Style {
        let tty = std::io::stdout().is_terminal();
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Style {
            color: tty && !no_color,
            live: tty,
        }
    }

    pub fn plain() -> Style {
        Style {
            color: false,
            live: false,
        }
    }

    fn paint(&self, style: anstyle::Style, text: &str) -> String {
        if self.color {
            format!("{}{text}{}", style.render(), style.render_reset())
        } else {
            text.to_string()
        }
    }

    pub fn good(&self, text: &str) -> String {
        self.paint(GOOD, text)
    }

    pub fn bad(&self, text: &str) -> String {
        self.paint(BAD, text)
    }

    pub fn dim(&self, text: &str) -> String {
        self.paint(DIM, text)
    }

    pub fn bold(&self, text: &str) -> String {
        self.paint(BOLD, text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The codes are the ones flotilla wrote by hand before anstyle: the same output.
    #[test]
    fn colours_are_the_same_escape_codes_and_none_without_colour() {
        let on = Style {
            color: true,
            live: true,
        };
        assert_eq!(on.good("a"), "\x1b[32ma\x1b[0m");
        assert_eq!(on.bad("a"), "\x1b[31ma\x1b[0m");
        assert_eq!(on.dim("a"), "\x1b[2ma\x1b[0m");
        assert_eq!(on.bold("a"), "\x1b[1ma\x1b[0m");
        let off = Style::plain();
        assert_eq!(off.good("a") + &off.dim("b"), "ab");
    }
}
