#!/usr/bin/env bash
# Runs test programs, adds up their "zt: N passed, N failed, N skipped" lines, and ends
# with the plain total line. A program that crashes or prints no summary counts as failed.
set -u
passed=0; failed=0; skipped=0
for t in "$@"; do
  echo "== $t"
  out=$("$t" 2>&1); rc=$?
  printf '%s\n' "$out" | grep -v '^zt: '
  line=$(printf '%s\n' "$out" | grep '^zt: ' | tail -n 1)
  if [ -z "$line" ]; then
    echo "FAIL $t: exited $rc without a summary"; failed=$((failed + 1)); continue
  fi
  read -r p f s <<<"$(printf '%s\n' "$line" | sed -E 's/^zt: ([0-9]+) passed, ([0-9]+) failed, ([0-9]+) skipped$/\1 \2 \3/')"
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then echo "FAIL $t: exit status $rc"; failed=$((failed + 1)); fi
done
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
