#!/bin/sh
# The CUDA compiler launcher of kiln's CUDA build: runs the compile command it is given (ccache
# first, when CMake found it) and keeps the ptxas resource usage that `--resource-usage` prints
# in <object>.ptxas beside the object, instead of on the terminal; everything else nvcc prints
# (warnings, errors) still goes to stderr. The ptxas log (cuda_catalog.h) is their concatenation.
out=""
prev=""
for arg in "$@"; do
  [ "$prev" = "-o" ] && out="$arg"
  prev="$arg"
done
err=$(mktemp) || exit 1
"$@" 2>"$err"
rc=$?
if [ -n "$out" ]; then
  grep -E '^(ptxas info|    [0-9]+ bytes stack frame)' "$err" >"$out.ptxas"
fi
grep -vE '^(ptxas info|    [0-9]+ bytes stack frame)' "$err" >&2
rm -f "$err"
exit $rc
