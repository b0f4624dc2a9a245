#!/bin/sh
# calc.py's acceptance tests: one `ok`/`not ok` line each (6).
n=0
check() { # name, expected output, command...
    n=$((n + 1)); name=$1; want=$2; shift 2
    got=$("$@" 2>/dev/null)
    if [ "$got" = "$want" ]; then echo "ok $n - $name"; else echo "not ok $n - $name (got: $got)"; fi
}
check "adds" 5 python3 calc.py 2 + 3
check "subtracts into negatives" -1.5 python3 calc.py 2 - 3.5
check "multiplies" 12 python3 calc.py 3 '*' 4
check "divides" 2.5 python3 calc.py 5 / 2
check "prints a whole quotient as an integer" 2 python3 calc.py 4 / 2
n=$((n + 1))
python3 calc.py 1 / 0 >/dev/null 2>zero.err
code=$?
if [ "$code" = 1 ] && grep -q "error: division by zero" zero.err; then
    echo "ok $n - division by zero fails with its message"
else
    echo "not ok $n - division by zero fails with its message (exit $code)"
fi
