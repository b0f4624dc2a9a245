# Helpers the commands share. They are named w_*; build.sh checks that every one a command
# calls is defined.

# Prints its arguments as one line.
w_print() { printf '%s\n' "$*"; }
