#!/bin/sh
# A daemon on a state directory that holds many finished big runs (M12 item 5, ADR-040):
#   scripts/daemon-growth.sh [RUNS] [TASKS]      (defaults: 10 runs of 10000 tasks)
# Measures, REPEATS times (default 3) and then their medians:
#   - first answer: from starting the daemon to the first `flotilla runs` it answers;
#   - idle RSS (VmRSS) once its start-up collection is done, against a fresh daemon's;
#   - RUNS concurrent `flotilla tail --json` replays (one per finished run): their peak
#     (VmHWM, reset before them) and the RSS 3 s after them;
#   - `flotilla status RUN --json`: the first call for the run that really ran (its status
#     was stored as it retired), and for a copy (no stored status, as for a run that
#     finished before ADR-040: the first call folds), then the median of three more.
# The state is made once: one real run of TASKS independent instant tasks (the scripted
# provider through a real daemon, about 2 minutes per 10,000 tasks on 2 cores), then copied
# RUNS-1 times inside the journal (the same events under new run ids). Each repetition starts
# from a copy of that journal, so that what a daemon writes (stored summaries) does not carry
# over. GROWTH_STATE=DIR keeps the state there and reuses it on the next call;
# FLOTILLA=PATH measures another build (default target/release/flotilla). Numbers on a busy
# machine vary: compare medians, and the same state under two builds.
set -eu
RUNS=${1:-10}
TASKS=${2:-10000}
REPEATS=${REPEATS:-3}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${FLOTILLA:-"$root/target/release/flotilla"}
[ -x "$bin" ] || { echo "build first: cargo build --release (or set FLOTILLA)" >&2; exit 2; }
scratch=$(mktemp -d)
if [ -n "${GROWTH_STATE:-}" ]; then made="$GROWTH_STATE"; else made="$scratch/made"; fi
daemon_pid=""
stop_daemon() {
    if [ -n "$daemon_pid" ]; then
        kill "$daemon_pid" 2>/dev/null || true
        wait "$daemon_pid" 2>/dev/null || true
        daemon_pid=""
    fi
}
cleanup() {
    stop_daemon
    rm -rf "$scratch"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
export NO_COLOR=1
now() { date +%s.%N; }
kib() { awk -v k="$1" '/^'"$1"':/ {print $2}' "/proc/$daemon_pid/status"; }
# Starts the daemon on state directory $1 and waits until it answers; the seconds that
# took are in $started_in.
start_daemon() {
    export FLOTILLA_STATE_DIR="$1"
    t0=$(now)
    "$bin" daemon >/dev/null 2>"$1/daemon.log" &
    daemon_pid=$!
    until "$bin" runs --json >/dev/null 2>&1; do sleep 0.01; done
    started_in=$(echo "$(now) - $t0" | bc -l)
}
# Waits for the daemon's start-up collection to be done (it runs once it listens).
await_collection() {
    i=0
    until grep -q "collection done" "$FLOTILLA_STATE_DIR/daemon.log" || [ "$i" -ge 600 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    sleep 2
}

if [ ! -f "$made/ready" ]; then
    mkdir -p "$made/state"
    "$root/scripts/scripted-repo.sh" "$made/repo" "$TASKS"
    echo "making one run of $TASKS tasks (minutes)..." >&2
    start_daemon "$made/state"
    "$bin" submit "run 1" --repo "$made/repo" >"$made/run.txt" 2>&1 \
        || { echo "the run did not complete: $made/run.txt" >&2; exit 1; }
    stop_daemon
    python3 - "$made/state/journal.sqlite" "$RUNS" >"$made/source" <<'PY'
import os, sqlite3, sys, time, uuid
con = sqlite3.connect(sys.argv[1])
(source,) = con.execute("SELECT id FROM runs").fetchone()
for i in range(1, int(sys.argv[2])):
    # A UUIDv7 (what RunId::generate makes): milliseconds first.
    raw = bytearray(int(time.time() * 1000 + i).to_bytes(6, "big") + os.urandom(10))
    raw[6] = (raw[6] & 0x0F) | 0x70
    raw[8] = (raw[8] & 0x3F) | 0x80
    run = str(uuid.UUID(bytes=bytes(raw)))
    con.execute("INSERT INTO runs (id, request, repo, config, created_ms) SELECT ?, ?, repo, config, created_ms + ? FROM runs WHERE id = ?", (run, f"run {i + 1}", i, source))
    con.execute("INSERT INTO events (run, at_ms, kind, data) SELECT ?, at_ms, kind, data FROM events WHERE run = ? ORDER BY seq", (run, source))
con.commit()
con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
print(source)
PY
    touch "$made/ready"
fi
echo "state: $made ($(du -sh "$made/state/journal.sqlite" | cut -f1) journal)"

mkdir "$scratch/fresh"
start_daemon "$scratch/fresh"
sleep 2
fresh=$(kib VmRSS)
stop_daemon
echo "fresh daemon: $((fresh / 1024)) MiB"

median() { sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
: >"$scratch/results"
r=1
while [ "$r" -le "$REPEATS" ]; do
    state="$scratch/state$r"
    mkdir "$state"
    cp "$made/state/journal.sqlite" "$made/state/journal.marker" "$state/"
    mkdir "$state/worktrees" # or the collection ends early without saying so
    start_daemon "$state"
    first=$started_in
    await_collection
    idle=$(kib VmRSS)
    runs=$("$bin" runs --json | jq -r '.[].id')
    echo 5 >"/proc/$daemon_pid/clear_refs" 2>/dev/null || true
    t0=$(now)
    tails=""
    for run in $runs; do
        "$bin" tail "$run" --json >"$scratch/tail.$run" &
        tails="$tails $!"
    done
    for pid in $tails; do wait "$pid" || true; done
    replay_s=$(echo "$(now) - $t0" | bc -l)
    peak=$(kib VmHWM)
    sleep 3
    after=$(kib VmRSS)
    events=$(wc -l <"$scratch/tail.$(echo "$runs" | head -n1)")
    retired=$(cat "$made/source")
    t0=$(now); "$bin" status "$retired" --json >/dev/null; status_stored=$(echo "$(now) - $t0" | bc -l)
    one=$(echo "$runs" | grep -v "$retired" | head -n1)
    t0=$(now); "$bin" status "$one" --json >/dev/null; status_first=$(echo "$(now) - $t0" | bc -l)
    status_more=$(for _ in 1 2 3; do
        t0=$(now); "$bin" status "$one" --json >/dev/null; echo "$(now) - $t0" | bc -l
    done | median)
    stop_daemon
    rm -rf "$state"
    printf '%s %s %s %s %s %s %s %s\n' "$first" "$idle" "$peak" "$after" "$replay_s" "$status_first" "$status_more" "$status_stored" >>"$scratch/results"
    printf 'repetition %d: first answer %.2f s, idle %d MiB, %d replays of %d events: peak %d MiB, after %d MiB (%.1f s); status of the retired run %.2f s; of a copy %.2f s first, %.2f s after\n' \
        "$r" "$first" $((idle / 1024)) "$RUNS" "$events" $((peak / 1024)) $((after / 1024)) "$replay_s" "$status_stored" "$status_first" "$status_more"
    r=$((r + 1))
done
col() { awk -v c="$1" '{print $c}' "$scratch/results" | median; }
printf 'median of %d: first answer %.2f s; idle %d MiB (fresh %d MiB); replays peak %d MiB, after %d MiB, %.1f s; status of the retired run %.2f s; of a copy %.2f s first, %.2f s after\n' \
    "$REPEATS" "$(col 1)" $(($(col 2) / 1024)) $((fresh / 1024)) $(($(col 3) / 1024)) $(($(col 4) / 1024)) "$(col 5)" "$(col 8)" "$(col 6)" "$(col 7)"
