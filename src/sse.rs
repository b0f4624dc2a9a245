//! Server-sent events, as the daemon streams them to `flotilla tail` and as LLM providers
//! stream their answers: one parser (eventsource-stream) behind one guard.

use eventsource_stream::Eventsource;
use futures::{Stream, StreamExt};

pub use eventsource_stream::{Event as SseFrame, EventStreamError};

/// The UTF-8 byte-order mark, which an event stream may start with (and which is not part
/// of its first line).
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Splits a `text/event-stream` body, however it arrives in chunks (a `data:` line split
/// across reads, a multi-byte character split across chunks), into its events. Comment
/// lines (`: keep-alive`) yield nothing. A transport error, or bytes that are not UTF-8 or
/// not SSE, end the stream with an `Err`.
///
/// eventsource-stream 0.2.3 panics on a stream that starts with a byte-order mark: it drops
/// the BOM as `&text[1..]`, one byte of the three, which is not a character boundary (found
/// by fuzzing, issue 11; an upstream fix is open). So the BOM is stripped here, before the
/// parser, even when it is split across chunks, and the parser is then given a leading
/// empty line: an empty line at the start of a stream dispatches nothing, and it means the
/// parser's own BOM check never looks at the stream's text, so a second U+FEFF (which the
/// SSE spec makes part of the first field's name) cannot reach that slice either.
pub fn frames<S, B, E>(
    chunks: S,
) -> impl Stream<Item = Result<SseFrame, EventStreamError<E>>> + Send
where
    S: Stream<Item = Result<B, E>> + Send,
    B: AsRef<[u8]> + Send,
    E: Send,
{
    let bytes = chunks.map(|chunk| chunk.map(|b| b.as_ref().to_vec()));
    let guarded =
        futures::stream::once(async { Ok(b"\n".to_vec()) }).chain(without_leading_bom(bytes));
    Box::pin(guarded).eventsource()
}

/// `chunks` without the [`BOM`] they may start with: bytes that could still be the start of
/// one are held back until enough have arrived to tell.
fn without_leading_bom<S, E>(chunks: S) -> impl Stream<Item = Result<Vec<u8>, E>> + Send
where
    S: Stream<Item = Result<Vec<u8>, E>> + Send,
    E: Send,
{
    // `Some(held)` while undecided: the bytes so far, all a proper prefix of the BOM.
    futures::stream::unfold(
        (Box::pin(chunks), Some(Vec::new())),
        |(mut chunks, mut held)| async move {
            loop {
                let Some(chunk) = chunks.next().await else {
                    // The stream ended inside what might have been a BOM: those bytes are
                    // data (not UTF-8, so the parser reports them).
                    return match held.take() {
                        Some(rest) if !rest.is_empty() => Some((Ok(rest), (chunks, None))),
                        _ => None,
                    };
                };
                let mut bytes = match (chunk, held.take()) {
                    (Err(e), _) => return Some((Err(e), (chunks, None))),
                    (Ok(bytes), None) => return Some((Ok(bytes), (chunks, None))),
                    (Ok(bytes), Some(mut so_far)) => {
                        so_far.extend_from_slice(&bytes);
                        so_far
                    }
                };
                if bytes.len() < BOM.len() && BOM.starts_with(&bytes) {
                    held = Some(bytes);
                    continue;
                }
                if bytes.starts_with(BOM) {
                    bytes.drain(..BOM.len());
                }
                return Some((Ok(bytes), (chunks, None)));
            }
        },
    )
}
