//! The client's event-stream parser (`flotilla::cli::client::parse_events`) on any bytes, split
//! into chunks anywhere (the first byte chooses the chunking). It must not panic, and how a
//! body is split must not change the events parsed from it.

#![no_main]

use flotilla::cli::client::parse_events;
use flotilla_actors::protocol::Event;
use futures::StreamExt;
use libfuzzer_sys::fuzz_target;

fn parse(chunks: Vec<Vec<u8>>) -> Vec<Option<Event>> {
    let stream = futures::stream::iter(chunks.into_iter().map(Ok::<_, String>));
    futures::executor::block_on(parse_events(stream).map(Result::ok).collect())
}

fuzz_target!(|data: &[u8]| {
    let Some((&seed, body)) = data.split_first() else {
        return;
    };
    // Chunk lengths from a small generator seeded by the first byte (0-length chunks too).
    let mut chunks = Vec::new();
    let mut state = u32::from(seed) | 1;
    let mut rest = body;
    while !rest.is_empty() {
        state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let len = ((state >> 16) as usize % 9).min(rest.len());
        chunks.push(rest[..len].to_vec());
        rest = &rest[len..];
    }
    let chunked = parse(chunks);
    let whole = parse(vec![body.to_vec()]);
    let events = |v: &[Option<Event>]| v.iter().flatten().cloned().collect::<Vec<_>>();
    assert_eq!(
        events(&chunked),
        events(&whole),
        "the chunking changed the events"
    );
});
