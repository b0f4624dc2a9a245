//! The LLM providers' answer parsers (`flotilla::providers::endpoint`) on any bytes: the
//! OpenAI and Anthropic stream assemblers (SSE frames, text deltas, tool calls assembled
//! from fragments, usage) with the body split into chunks anywhere, and the whole-body
//! parsers. The first byte picks the format and the chunking. Nothing may panic; how a body
//! is split must not change what is assembled from it (when both splits parse); an answer is never larger than the
//! body it came from, and never holds more tool calls than the cap.

#![no_main]

use flotilla::providers::endpoint::{parse_stream_chunks, parse_whole_body};
use flotilla::providers::wire::WireFormat;
use flotilla::providers::wire::MAX_TOOL_CALLS;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&seed, body)) = data.split_first() else {
        return;
    };
    let format = if seed & 1 == 0 {
        WireFormat::OpenAi
    } else {
        WireFormat::Anthropic
    };
    let mut chunks = Vec::new();
    let mut state = u32::from(seed) | 1;
    let mut rest = body;
    while !rest.is_empty() {
        state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let len = ((state >> 16) as usize % 13).min(rest.len());
        chunks.push(rest[..len].to_vec());
        rest = &rest[len..];
    }
    let chunked = parse_stream_chunks(format, chunks);
    let whole = parse_stream_chunks(format, vec![body.to_vec()]);
    // Whether it parses may depend on the split (a stream is read only up to its end
    // event: bytes after it are never decoded in one split and fail to decode in another),
    // but what parses must not.
    if let (Ok(a), Ok(b)) = (&chunked, &whole) {
        assert_eq!(a, b, "the chunking changed the answer");
    }
    if let Ok(answer) = &whole {
        assert!(answer.content.len() <= body.len());
        assert!(answer.tool_calls.len() <= MAX_TOOL_CALLS);
    }
    if let Ok(text) = std::str::from_utf8(body)
        && let Ok(answer) = parse_whole_body(format, text)
    {
        // Escaping raw control characters may lengthen strings, never beyond 6x.
        assert!(answer.content.len() <= text.len() * 6);
    }
});
