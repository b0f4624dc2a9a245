#!/bin/sh
# Creates the merge example's starting repository in DIR: wordtool, a tiny shell project
# whose build (`sh build.sh`) and tests (`sh test.sh`) really run, with flotilla.toml and
# the scenario, committed on main. Then: flotilla submit "…" --repo DIR (README.md here).
set -eu
if [ $# -ne 1 ]; then
    echo "usage: $0 DIR   (DIR must not exist yet, or be empty)" >&2
    exit 2
fi
dir=$1
here=$(cd "$(dirname "$0")" && pwd)
if [ -e "$dir" ] && [ -n "$(ls -A "$dir")" ]; then
    echo "$0: $dir is not empty; give a new directory" >&2
    exit 1
fi
mkdir -p "$dir"
cp -R "$here/project/." "$dir/"
cp "$here/flotilla.toml" "$here/scenario.toml" "$dir/"
cd "$dir"
git init -q -b main
git add -A
git -c user.name=flotilla-example -c user.email=example@localhost commit -q -m "wordtool: echo, build and tests"
sh build.sh
sh test.sh >/dev/null
echo "ready: $(pwd) (main at $(git rev-parse --short HEAD), build and tests green)"
