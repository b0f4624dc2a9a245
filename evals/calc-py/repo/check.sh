#!/bin/sh
# The gate and the sweep: calc.py compiles. The user's file: a task that changes it waits for them.
set -e
python3 -m py_compile calc.py
