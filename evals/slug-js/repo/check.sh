#!/bin/sh
# The gate and the sweep: slug.js parses. The user's file: a task that changes it waits for them.
set -e
node --check slug.js
