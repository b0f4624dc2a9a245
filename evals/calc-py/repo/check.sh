#!/bin/sh
# The gate and the sweep: calc.py, once it exists, compiles. The user's file: a task that
# changes it waits for them (ADR-016).
set -e
[ -f calc.py ] || exit 0
python3 -m py_compile calc.py
