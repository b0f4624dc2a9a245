#!/bin/sh
# The daemon's resident set over many scripted runs, one after another (M7, ADR-013):
#   scripts/daemon-memory.sh [RUNS] [TASKS]      (defaults: 10 runs of 10000 tasks)
# Uses target/release/flotilla (cargo build --release first). Each run is TASKS independent
# instant tasks in sprints of 500, through a real daemon in a temporary state directory, with
# a git worktree per attempt as always (about 2 minutes per 10,000 tasks on 2 cores). Prints
# the daemon's VmRSS when idle and after each run (3 s after it ends: its thread is stopped
# and a collection point has run), split into anonymous memory (the heap, stacks) and
# file-backed pages (the binary's code as it gets paged in), and its peak (VmHWM).
set -eu
RUNS=${1:-10}
TASKS=${2:-10000}
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/target/release/flotilla"
[ -x "$bin" ] || { echo "build first: cargo build --release" >&2; exit 2; }
work=$(mktemp -d)
daemon_pid=""
cleanup() {
    [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT INT TERM
mkdir "$work/state"
"$root/scripts/scripted-repo.sh" "$work/repo" "$TASKS"
export FLOTILLA_STATE_DIR="$work/state" NO_COLOR=1
"$bin" daemon 2>"$work/daemon.log" &
daemon_pid=$!
sleep 2
rss() { grep "$1" "/proc/$daemon_pid/status" | awk '{printf "%.1f MiB", $2 / 1024}'; }
echo "idle: $(rss VmRSS) (anonymous $(rss RssAnon), file-backed $(rss RssFile))"
i=1
while [ "$i" -le "$RUNS" ]; do
    started=$(date +%s)
    if "$bin" submit "run $i" --repo "$work/repo" >"$work/run.txt" 2>&1; then outcome=completed; else outcome="NOT completed"; fi
    sleep 3
    echo "after run $i ($outcome, $(( $(date +%s) - started )) s): $(rss VmRSS) (anonymous $(rss RssAnon), file-backed $(rss RssFile)), peak $(rss VmHWM)"
    i=$((i + 1))
done
