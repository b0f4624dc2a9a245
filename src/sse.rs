//! Server-sent events, as the daemon streams them to `flotilla tail` and as LLM providers
//! stream their answers: one parser, linear in the bytes it is given, with a bound on what
//! it holds.
//!
//! flotilla used eventsource-stream 0.2.3 until it was found (issue 20) to take time
//! quadratic in a line's length: it parses its whole buffer again from the start for every
//! chunk of a line that has not ended (one 8 MiB line: 13.7 s of CPU), and copies what
//! follows each line for every line. It also panicked on a leading byte-order mark (issue
//! 11). The parser here scans each byte once, holds at most `max_pending` bytes of an
//! unfinished line and event, and ends the stream with [`SseError::TooLarge`] past that, so
//! a line that never ends fails at once instead of keeping a core busy until a timeout
//! (ADR-019).

use std::collections::VecDeque;

use futures::{Stream, StreamExt};

/// One dispatched event: its `event:` type (`message` when it names none), its `data:`
/// lines joined with `\n`, and the last `id:` seen.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SseFrame {
    pub event: String,
    pub data: String,
    pub id: String,
}

/// Why a stream of events ended early.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError<E> {
    /// The body's own transport failed (or stalled, for whoever gives the chunks).
    #[error("{0}")]
    Transport(E),
    /// A line is not UTF-8.
    #[error("the event stream is not UTF-8 text")]
    NotUtf8,
    /// An unfinished line and the event it belongs to passed the bound.
    #[error("an event in the stream passed {limit} bytes before it ended")]
    TooLarge { limit: usize },
}

/// The UTF-8 byte-order mark, which an event stream may start with (and which is not part
/// of its first line).
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// What the parser found wrong (the transport's errors are the caller's).
#[derive(Debug)]
enum Problem {
    NotUtf8,
    TooLarge(usize),
}

struct Unfolding<S, E> {
    chunks: std::pin::Pin<Box<S>>,
    parser: Parser,
    ready: VecDeque<SseFrame>,
    /// The error to yield once the frames before it are out.
    failure: Option<SseError<E>>,
    done: bool,
}

/// The line-by-line parser: bytes in, frames out, each byte looked at once.
#[derive(Debug)]
struct Parser {
    /// Bytes of the line not yet ended (and, before the BOM is decided, the stream's
    /// first bytes).
    line: Vec<u8>,
    /// The stream's start is past (a leading BOM was dropped or there was none).
    started: bool,
    /// The last line ended with `\r`: a `\n` right after it is part of that line end.
    after_cr: bool,
    event: String,
    data: String,
    last_id: String,
    max_pending: usize,
}

impl Parser {
    fn new(max_pending: usize) -> Self {
        Parser {
            line: Vec::new(),
            started: false,
            after_cr: false,
            event: String::new(),
            data: String::new(),
            last_id: String::new(),
            max_pending,
        }
    }

    /// Takes `bytes`, pushing each event they complete to `out`; an error ends the parse.
    fn feed(&mut self, bytes: &[u8], out: &mut VecDeque<SseFrame>) -> Result<(), Problem> {
        let mut rest = bytes;
        if !self.started {
            // Hold bytes that may still be the BOM until enough have come to tell.
            let want = BOM.len() - self.line.len();
            let take = want.min(rest.len());
            self.line.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if self.line.len() < BOM.len() && BOM.starts_with(&self.line) {
                return Ok(());
            }
            self.started = true;
            let held = std::mem::take(&mut self.line);
            let held = held.strip_prefix(BOM).unwrap_or(&held);
            self.scan(held, out)?;
        }
        self.scan(rest, out)
    }

    fn scan(&mut self, mut bytes: &[u8], out: &mut VecDeque<SseFrame>) -> Result<(), Problem> {
        if self.after_cr && !bytes.is_empty() {
            self.after_cr = false;
            if bytes[0] == b'\n' {
                bytes = &bytes[1..];
            }
        }
        while let Some(end) = bytes.iter().position(|&b| b == b'\n' || b == b'\r') {
            // Checked as if the line's bytes had come one at a time, so that how the body
            // is split never changes where the stream fails.
            self.check_pending(self.line.len() + end)?;
            if self.line.is_empty() {
                self.process(&bytes[..end], out)?;
            } else {
                self.line.extend_from_slice(&bytes[..end]);
                let line = std::mem::take(&mut self.line);
                self.process(&line, out)?;
            }
            let cr = bytes[end] == b'\r';
            bytes = &bytes[end + 1..];
            if cr {
                match bytes.first() {
                    Some(b'\n') => bytes = &bytes[1..],
                    Some(_) => {}
                    // The `\n` of a `\r\n` may come with the next chunk.
                    None => self.after_cr = true,
                }
            }
        }
        self.check_pending(self.line.len() + bytes.len())?;
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    /// Whether a line of `line` bytes, with the event so far, is within the bound.
    fn check_pending(&self, line: usize) -> Result<(), Problem> {
        let pending = line + self.data.len() + self.event.len();
        if pending > self.max_pending {
            return Err(Problem::TooLarge(self.max_pending));
        }
        Ok(())
    }

    /// One whole line, without its line end.
    fn process(&mut self, line: &[u8], out: &mut VecDeque<SseFrame>) -> Result<(), Problem> {
        let line = std::str::from_utf8(line).map_err(|_| Problem::NotUtf8)?;
        if line.is_empty() {
            let event = std::mem::take(&mut self.event);
            let mut data = std::mem::take(&mut self.data);
            if data.is_empty() {
                return Ok(());
            }
            data.pop(); // the `\n` after the last data line
            out.push_back(SseFrame {
                event: if event.is_empty() {
                    "message".into()
                } else {
                    event
                },
                data,
                id: self.last_id.clone(),
            });
            return Ok(());
        }
        if line.starts_with(':') {
            return Ok(());
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "event" => value.clone_into(&mut self.event),
            "data" => {
                self.data.push_str(value);
                self.data.push('\n');
            }
            "id" if !value.contains('\0') => value.clone_into(&mut self.last_id),
            // `retry` and unknown fields: nothing flotilla uses.
            _ => {}
        }
        Ok(())
    }

    /// The stream ended: an unfinished event is dropped (as the spec says), but bytes that
    /// are not text are still an error.
    fn end(&mut self) -> Result<(), Problem> {
        let line = std::mem::take(&mut self.line);
        std::str::from_utf8(&line).map_err(|_| Problem::NotUtf8)?;
        Ok(())
    }
}

/// Splits a `text/event-stream` body, however it arrives in chunks (a `data:` line split
/// across reads, a multi-byte character or a `\r\n` split across chunks), into its events.
/// Comment lines (`: keep-alive`) yield nothing; a leading byte-order mark is dropped. A
/// transport error, bytes that are not UTF-8, or an unfinished line and event holding more
/// than `max_pending` bytes end the stream with an `Err`, after which it yields nothing.
pub fn frames<S, B, E>(
    chunks: S,
    max_pending: usize,
) -> impl Stream<Item = Result<SseFrame, SseError<E>>> + Send + Unpin
where
    S: Stream<Item = Result<B, E>> + Send,
    B: AsRef<[u8]> + Send,
    E: Send,
{
    let state = Unfolding {
        chunks: Box::pin(chunks),
        parser: Parser::new(max_pending),
        ready: VecDeque::new(),
        failure: None,
        done: false,
    };
    Box::pin(futures::stream::unfold(state, |mut state| async move {
        loop {
            if let Some(frame) = state.ready.pop_front() {
                return Some((Ok(frame), state));
            }
            // Events completed before an error still count; nothing after it does.
            if let Some(error) = state.failure.take() {
                return Some((Err(error), state));
            }
            if state.done {
                return None;
            }
            let problem = match state.chunks.next().await {
                Some(Ok(bytes)) => state.parser.feed(bytes.as_ref(), &mut state.ready).err(),
                Some(Err(e)) => {
                    state.failure = Some(SseError::Transport(e));
                    None
                }
                None => {
                    state.done = true;
                    state.parser.end().err()
                }
            };
            if let Some(problem) = problem {
                state.failure = Some(match problem {
                    Problem::NotUtf8 => SseError::NotUtf8,
                    Problem::TooLarge(limit) => SseError::TooLarge { limit },
                });
            }
            state.done |= state.failure.is_some();
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(chunks: Vec<&[u8]>, max: usize) -> Vec<Result<SseFrame, SseError<()>>> {
        let chunks = futures::stream::iter(chunks.into_iter().map(|c| Ok::<_, ()>(c.to_vec())));
        futures::executor::block_on(frames(chunks, max).collect())
    }

    fn data(results: &[Result<SseFrame, SseError<()>>]) -> Vec<String> {
        results
            .iter()
            .map(|r| r.as_ref().map(|f| f.data.clone()).unwrap())
            .collect()
    }

    #[test]
    fn every_line_end_and_split_gives_the_same_events() {
        let body = b"data: a\r\ndata: b\r\n\r\n: note\rid: 7\revent: e\rdata: c\r\rdata: d\n\n";
        let whole = parse(vec![body], 1024);
        assert_eq!(data(&whole), ["a\nb", "c", "d"]);
        assert_eq!(whole[1].as_ref().unwrap().event, "e");
        assert_eq!(whole[1].as_ref().unwrap().id, "7");
        assert_eq!(whole[2].as_ref().unwrap().event, "message");
        for split in 0..body.len() {
            assert_eq!(
                parse(vec![&body[..split], &body[split..]], 1024),
                whole,
                "{split}"
            );
        }
        let bytewise: Vec<&[u8]> = body.chunks(1).collect();
        assert_eq!(parse(bytewise, 1024), whole);
    }

    #[test]
    fn a_line_that_never_ends_fails_at_the_bound_instead_of_waiting_for_more() {
        // An endless body: only the bound can end this.
        let endless = futures::stream::repeat_with(|| Ok::<_, ()>(vec![b'x'; 4096]));
        let first = futures::executor::block_on(frames(endless, 1 << 20).next());
        assert_eq!(first, Some(Err(SseError::TooLarge { limit: 1 << 20 })));
        // The events before the long line still come, then the error, then nothing.
        let results = parse(vec![b"data: ok\n\ndata: ", &[b'y'; 2000]], 1000);
        assert_eq!(
            results,
            vec![
                Ok(SseFrame {
                    event: "message".into(),
                    data: "ok".into(),
                    id: String::new()
                }),
                Err(SseError::TooLarge { limit: 1000 })
            ]
        );
        // Many data lines of one event count together.
        let lines = "data: 0123456789\n".repeat(100);
        assert_eq!(
            parse(vec![lines.as_bytes()], 1000),
            vec![Err(SseError::TooLarge { limit: 1000 })]
        );
    }

    /// eventsource-stream parsed its buffer again for every chunk of an unfinished line:
    /// this took 13.7 s of CPU. Linear, it is one pass over 8 MiB.
    #[test]
    fn an_eight_mib_line_in_small_chunks_parses_in_one_pass() {
        let mut body = b"data: ".to_vec();
        body.extend(std::iter::repeat_n(b'z', 8 << 20));
        body.extend_from_slice(b"\n\n");
        let chunks: Vec<&[u8]> = body.chunks(1024).collect();
        let results = parse(chunks, 9 << 20);
        assert_eq!(results.len(), 1);
        assert_eq!(results[0].as_ref().unwrap().data.len(), 8 << 20);
    }

    #[test]
    fn bytes_that_are_not_text_end_the_stream_with_an_error() {
        assert_eq!(
            parse(vec![b"data: a\n\ndata: \xff\n\ndata: b\n\n"], 100),
            vec![
                Ok(SseFrame {
                    event: "message".into(),
                    data: "a".into(),
                    id: String::new()
                }),
                Err(SseError::NotUtf8)
            ]
        );
        assert_eq!(
            parse(vec![b"data: \xe2\x82"], 100),
            vec![Err(SseError::NotUtf8)]
        );
        assert_eq!(
            data(&parse(vec![b"data: \xe2\x82", b"\xac\n\n"], 100)),
            ["€"]
        );
    }
}
