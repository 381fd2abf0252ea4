#!/bin/sh
# Turns standard input into a C string constant named $1 (used to compile
# config/default.ini into the library).
echo "static const char $1[] ="
sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/    "/' -e 's/$/\\n"/'
echo "    ;"
