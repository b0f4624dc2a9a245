out=$(sh bin/wordtool echo hello world)
test "$out" = "hello world" || { echo "tests/echo.sh:1: expected 'hello world', got '$out'"; exit 1; }
