#!/usr/bin/env bash
# Runs every fuzz target in turn for SECONDS each (default 600) and prints, per target,
# the executions, the coverage and the crashes (files in artifacts/TARGET: crashes,
# timeouts, out-of-memory). Exits non-zero if any target crashed. Targets are built as
# cargo-fuzz does by default: optimized, with debug assertions, overflow checks and ASan.
#
#   fuzz/run.sh [SECONDS]                     needs nightly and cargo-fuzz
#   FUZZ_TARGETS="sse_events config" fuzz/run.sh 60     only those targets
#
# New inputs go to fuzz/corpus/TARGET (not committed); fuzz/seeds/TARGET holds the
# hand-written seeds, fuzz/dict/TARGET.dict each format's keywords. A crash is minimized
# with `cargo +nightly fuzz tmin TARGET fuzz/artifacts/TARGET/crash-…` and becomes a test
# in tests/it/fuzz_regressions.rs.
set -uo pipefail

seconds="${1:-600}"
cd "$(dirname "$0")"
targets="${FUZZ_TARGETS:-planner_answer task_graph scenario config sse_events provider_stream}"
mkdir -p logs

cargo +nightly fuzz build >/dev/null || { echo "fuzz build failed" >&2; exit 2; }

status=0
summary=()
for target in $targets; do
    mkdir -p "corpus/$target" "seeds/$target" "artifacts/$target"
    dict=()
    [ -f "dict/$target.dict" ] && dict=("-dict=dict/$target.dict")
    log="logs/$target.log"
    echo "== $target: ${seconds}s (log: fuzz/$log)"
    cargo +nightly fuzz run "$target" "corpus/$target" "seeds/$target" -- \
        -max_total_time="$seconds" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
        "${dict[@]}" >"$log" 2>&1
    rc=$?
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | tail -1 | grep -o '[0-9]*$')
    cov=$(grep -o ' cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$')
    crashes=$(find "artifacts/$target" -type f | wc -l)
    line=$(printf '%-15s executions %-12s coverage %-7s crashes %s' \
        "$target" "${execs:-?}" "${cov:-?}" "$crashes")
    if [ "$crashes" -gt 0 ] || [ "$rc" -ne 0 ]; then
        status=1
        line="$line  (libFuzzer exit $rc; see fuzz/$log and fuzz/artifacts/$target)"
    fi
    echo "$line"
    summary+=("$line")
done

echo
echo "== summary (${seconds}s per target)"
printf '%s\n' "${summary[@]}"
exit "$status"
