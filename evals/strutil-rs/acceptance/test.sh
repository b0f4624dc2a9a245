#!/bin/sh
# strutil's acceptance tests (5), as `ok`/`not ok` lines: libtest's lines, translated. A
# crate that does not build prints none of them: every test counts as failed.
mkdir -p tests && cp acceptance/acceptance.rs tests/acceptance.rs
cargo test --offline --test acceptance -- --test-threads=1 2>&1 |
    sed -n 's/^test \(.*\) \.\.\. ok$/ok - \1/p; s/^test \(.*\) \.\.\. FAILED$/not ok - \1/p'
