#!/bin/sh
# wordtool's build, in two steps:
#   1. every script parses (`sh -n`);
#   2. a link step: every w_* helper that a module calls is defined in some module.
# `sh build.sh --syntax` runs step 1 only: the merge gate's quick check. The Reconciler runs
# both. Errors are printed as `path:line: error: message`.
set -u
status=0
for script in bin/wordtool lib/*.sh tests/*.sh; do
    [ -f "$script" ] || continue
    if ! sh -n "$script" 2>/dev/null; then
        echo "$script:1: error: $(sh -n "$script" 2>&1 | head -n 1)"
        status=1
    fi
done
if [ "${1:-}" = "--syntax" ]; then
    exit $status
fi
defined=$(sed -n 's/^\(w_[a-z][a-z_]*\)().*/\1/p' lib/*.sh | sort -u)
errors=$(
    for module in lib/*.sh; do
        grep -n -o 'w_[a-z][a-z_]*' "$module" | while IFS=: read -r line name; do
            if ! printf '%s\n' "$defined" | grep -qx "$name"; then
                echo "$module:$line: error: undefined function $name"
            fi
        done
    done
)
if [ -n "$errors" ]; then
    printf '%s\n' "$errors"
    status=1
fi
exit $status
