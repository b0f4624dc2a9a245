#!/bin/sh
# Runs every tests/*.sh from the project's root; a test prints why and exits non-zero when
# it fails.
set -u
failed=0
for t in tests/*.sh; do
    if sh "$t"; then
        echo "ok   $t"
    else
        echo "FAIL $t"
        failed=1
    fi
done
exit $failed
