#!/usr/bin/env bash
# Runs test programs, adds up their "zt: N passed, N failed, N skipped" lines, and ends
# with the plain total line. A program that crashes or prints no summary counts as failed.
# Up to ZT_JOBS programs (default: the number of cores) run at once; each one's output is
# held and printed whole, in the order given, so outputs never interleave.
set -u
passed=0; failed=0; skipped=0
jobs_max=${ZT_JOBS:-$(nproc 2>/dev/null || echo 1)}
[ "$jobs_max" -ge 1 ] 2>/dev/null || jobs_max=1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/zt-run.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
tests=("$@"); n=${#tests[@]}; next=0; running=0
launch() { ( t0=$SECONDS; "${tests[$1]}" >"$tmp/$1.out" 2>&1; echo "$? $((SECONDS - t0))" >"$tmp/$1.rc.part"
             mv "$tmp/$1.rc.part" "$tmp/$1.rc" ) & }
for ((i = 0; i < n; i++)); do
  while :; do
    # count what has finished, start more while fewer than jobs_max run
    running=0; for ((k = 0; k < next; k++)); do [ -e "$tmp/$k.rc" ] || running=$((running + 1)); done
    while [ "$next" -lt "$n" ] && [ "$running" -lt "$jobs_max" ]; do
      launch "$next"; next=$((next + 1)); running=$((running + 1))
    done
    [ -e "$tmp/$i.rc" ] && break
    wait -n 2>/dev/null || sleep 0.05
  done
  t=${tests[$i]}; out=$(cat "$tmp/$i.out"); read -r rc secs <"$tmp/$i.rc"
  echo "== $t (${secs}s)"
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
