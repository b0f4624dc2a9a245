# echo WORD...: prints the words.
cmd_echo() { w_print "$@"; }
