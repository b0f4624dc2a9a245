#!/bin/sh
# The repository the daemon measurements run on (daemon-memory.sh, daemon-growth.sh):
#   scripts/scripted-repo.sh DIR TASKS
# Makes DIR a git repository on main with one commit: a scripted scenario (scenario.toml) of
# TASKS independent instant tasks in sprints of 500, each writing its own src/mN.rs, and a
# flotilla.toml that runs it (16 workers, room for TASKS nodes, answers big enough for a
# sprint).
set -eu
[ $# -eq 2 ] || { echo "usage: $0 DIR TASKS" >&2; exit 2; }
mkdir -p "$1"
cd "$1"
git init -q -b main
python3 - "$2" <<'PY'
import sys
tasks, per = int(sys.argv[1]), 500
out = ["[agent]\ndelay_ms = 0\ntokens = 1\n"]
for start in range(0, tasks, per):
    out.append("[[planner.answers]]\ntasks = [\n")
    for n in range(start, min(start + per, tasks)):
        out.append(f'  {{ description = "module {n}", scope = ["src/m{n}.rs"] }},\n')
    out.append("]\n")
open("scenario.toml", "w").write("".join(out))
open("flotilla.toml", "w").write(f"""[provider]
kind = "scripted"
scenario = "scenario.toml"

[limits]
max_nodes = {tasks + 100}
max_workers = 16

[planner]
max_answer_bytes = 4000000
""")
PY
git add -A
git -c user.name=bench -c user.email=bench@localhost commit -qm start
