#!/bin/sh
# One subjob of scan.toml: count the numbers of numbers.txt that fall in bin $1 (width 10).
# The input files are linked into the job's working directory; histogram.txt is kept as an output file.
set -eu
bin=$1
lo=$((bin * 10))
hi=$((lo + 9))
n=$(awk -v lo="$lo" -v hi="$hi" '$1 >= lo && $1 <= hi { n++ } END { print n + 0 }' numbers.txt)
"$ORCH_LOG" INFO "bin $bin holds $n numbers"
echo "bin $bin [$lo, $hi]: $n"
echo "$bin $n" > histogram.txt
