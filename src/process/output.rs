//! A command's output as it arrives: each pipe read in chunks into a capture that keeps its
//! first and last halves within a byte cap ([`Kept`]), and split into lines for the caller's
//! sink ([`Lines`]), a line over the cap cut at a character boundary. Knows nothing of
//! processes or sandboxes; [`super`] drives it.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;

use flotilla_actors::ports::{Captured, LineSink, Stream};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Bytes read from a pipe at a time.
const READ_CHUNK: usize = 16 * 1024;

/// One of the command's output streams: read as it arrives, into the capture and the sink.
pub(super) struct Pipe {
    reader: Option<Pin<Box<dyn AsyncRead + Send>>>,
    buf: Box<[u8]>,
    kept: Kept,
    lines: Option<Lines>,
}

impl Pipe {
    pub(super) fn new(
        stream: Stream,
        reader: Option<impl AsyncRead + Send + 'static>,
        cap: usize,
        sink: Option<LineSink>,
    ) -> Self {
        Pipe {
            reader: reader.map(|r| Box::pin(r) as Pin<Box<dyn AsyncRead + Send>>),
            buf: vec![0; READ_CHUNK].into_boxed_slice(),
            kept: Kept::new(cap),
            lines: sink.map(|sink| Lines::new(stream, sink, cap)),
        }
    }

    pub(super) fn open(&self) -> bool {
        self.reader.is_some()
    }

    /// Reads what the stream has and hands it on; true when there were bytes. Cancel-safe
    /// (the loops above race it against timers): `read` is, and the bytes it returns are
    /// handed on in the same poll.
    pub(super) async fn pump(&mut self) -> bool {
        let Some(reader) = self.reader.as_mut() else {
            return false;
        };
        match reader.read(&mut self.buf).await {
            Ok(0) => {
                self.close();
                false
            }
            Ok(n) => {
                let bytes = &self.buf[..n];
                self.kept.push(bytes);
                if let Some(lines) = self.lines.as_mut() {
                    lines.push(bytes);
                }
                true
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => false,
            // A pipe that fails to read is a pipe that has ended, for our purposes.
            Err(_) => {
                self.close();
                false
            }
        }
    }

    pub(super) fn close(&mut self) {
        self.reader = None;
        if let Some(lines) = self.lines.as_mut() {
            lines.finish();
        }
    }

    pub(super) fn finish(mut self) -> Captured {
        self.close();
        self.kept.captured()
    }
}

/// Splits a stream into lines for the sink. A line longer than the cap arrives as its first
/// `cap` bytes (cut back to a character boundary) and the rest of it, up to its newline, is
/// skipped: a sink wants events, and an event that big is not one it can use whole anyway.
/// A last line without a newline arrives when the stream ends.
pub(super) struct Lines {
    stream: Stream,
    sink: LineSink,
    max: usize,
    pending: Vec<u8>,
    /// Inside an overlong line that was already delivered cut.
    skipping: bool,
}

impl Lines {
    pub(super) fn new(stream: Stream, sink: LineSink, max: usize) -> Self {
        Lines {
            stream,
            sink,
            max,
            pending: Vec::new(),
            skipping: false,
        }
    }

    pub(super) fn push(&mut self, mut bytes: &[u8]) {
        while let Some(newline) = bytes.iter().position(|&b| b == b'\n') {
            self.add(&bytes[..newline]);
            if !self.skipping {
                self.deliver(false);
            }
            self.pending.clear();
            self.skipping = false;
            bytes = &bytes[newline + 1..];
        }
        self.add(bytes);
    }

    pub(super) fn add(&mut self, part: &[u8]) {
        if self.skipping || part.is_empty() {
            return;
        }
        let room = self.max.saturating_sub(self.pending.len());
        if part.len() <= room {
            self.pending.extend_from_slice(part);
        } else {
            self.pending.extend_from_slice(&part[..room]);
            self.deliver(true);
            self.pending.clear();
            self.skipping = true;
        }
    }

    pub(super) fn deliver(&self, cut: bool) {
        let end = if cut {
            self.pending.len() - incomplete_tail_len(&self.pending)
        } else {
            self.pending.len()
        };
        self.sink
            .line(self.stream, &String::from_utf8_lossy(&self.pending[..end]));
    }

    /// The stream ended: its last line, if it had no newline.
    pub(super) fn finish(&mut self) {
        if !self.skipping && !self.pending.is_empty() {
            self.deliver(false);
        }
        self.pending.clear();
        self.skipping = false;
    }
}

/// One stream's capture, in memory bounded by the cap whatever the command writes: the
/// first half of the cap as it came, the last half in a ring that forgets its oldest bytes.
/// While the stream is within the cap, the two together are all of it.
pub(super) struct Kept {
    cap: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: u64,
}

impl Kept {
    pub(super) fn new(cap: usize) -> Self {
        Kept {
            cap,
            head: Vec::new(),
            tail: VecDeque::new(),
            total: 0,
        }
    }

    pub(super) fn head_cap(&self) -> usize {
        self.cap / 2
    }

    pub(super) fn tail_cap(&self) -> usize {
        self.cap - self.cap / 2
    }

    pub(super) fn push(&mut self, mut bytes: &[u8]) {
        self.total += bytes.len() as u64;
        let into_head = self
            .head_cap()
            .saturating_sub(self.head.len())
            .min(bytes.len());
        self.head.extend_from_slice(&bytes[..into_head]);
        bytes = &bytes[into_head..];
        let tail_cap = self.tail_cap();
        if bytes.len() >= tail_cap {
            self.tail.clear();
            self.tail.extend(&bytes[bytes.len() - tail_cap..]);
        } else {
            let overflow = (self.tail.len() + bytes.len()).saturating_sub(tail_cap);
            self.tail.drain(..overflow);
            self.tail.extend(bytes);
        }
    }

    pub(super) fn captured(mut self) -> Captured {
        let tail = self.tail.make_contiguous();
        let held = (self.head.len() + tail.len()) as u64;
        if held == self.total {
            let mut all = self.head.clone();
            all.extend_from_slice(tail);
            let text = String::from_utf8_lossy(&all);
            // Invalid bytes grow threefold as U+FFFD; past the cap, it is cut like the rest.
            if text.len() <= self.cap {
                return Captured {
                    text: text.into_owned(),
                    total_bytes: self.total,
                    cut_bytes: 0,
                };
            }
        }
        let head_budget = self.cap / 2;
        let tail_budget = self.cap - self.cap / 2;
        let (head_text, head_used) = lossy_prefix(&self.head, head_budget);
        let (tail_text, tail_used) = lossy_suffix(tail, tail_budget);
        let cut = self.total - (head_used + tail_used) as u64;
        Captured {
            text: format!("{head_text}\n[… {cut} bytes cut …]\n{tail_text}"),
            total_bytes: self.total,
            cut_bytes: cut,
        }
    }
}

/// Lossy UTF-8 as (text bytes, raw bytes) per character: `from_utf8_lossy` gives one
/// U+FFFD for each invalid sequence `utf8_chunks` reports.
fn pieces(bytes: &[u8]) -> impl Iterator<Item = (usize, usize)> + '_ {
    bytes.utf8_chunks().flat_map(|chunk| {
        let bad = chunk.invalid().len();
        chunk
            .valid()
            .chars()
            .map(|c| (c.len_utf8(), c.len_utf8()))
            .chain((bad > 0).then_some(('\u{FFFD}'.len_utf8(), bad)))
    })
}

/// The start of `bytes` as lossy text of at most `budget` bytes, never ending inside a
/// character; and how many raw bytes it shows.
fn lossy_prefix(bytes: &[u8], budget: usize) -> (String, usize) {
    let bytes = &bytes[..bytes.len() - incomplete_tail_len(bytes)];
    let (mut text_len, mut end) = (0, 0);
    for (text, raw) in pieces(bytes) {
        if text_len + text > budget {
            break;
        }
        text_len += text;
        end += raw;
    }
    (String::from_utf8_lossy(&bytes[..end]).into_owned(), end)
}

/// The end of `bytes` as lossy text of at most `budget` bytes, never starting inside a
/// character; and how many raw bytes it shows.
fn lossy_suffix(bytes: &[u8], budget: usize) -> (String, usize) {
    let skip = bytes
        .iter()
        .take(3)
        .take_while(|&&b| b & 0xC0 == 0x80)
        .count();
    let bytes = &bytes[skip..];
    let mut excess = pieces(bytes)
        .map(|(text, _)| text)
        .sum::<usize>()
        .saturating_sub(budget);
    let mut start = 0;
    for (text, raw) in pieces(bytes) {
        if excess == 0 {
            break;
        }
        excess = excess.saturating_sub(text);
        start += raw;
    }
    let kept = &bytes[start..];
    (String::from_utf8_lossy(kept).into_owned(), kept.len())
}

/// How many bytes at the end of `bytes` are the start of a character cut off there.
fn incomplete_tail_len(bytes: &[u8]) -> usize {
    for back in 1..=bytes.len().min(3) {
        let byte = bytes[bytes.len() - back];
        if byte & 0xC0 == 0x80 {
            continue;
        }
        let width = match byte {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if width > back { back } else { 0 };
    }
    0
}
