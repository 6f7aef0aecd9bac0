#!/usr/bin/env bash
# README.md's quoted outputs, checked against the programs. A fenced block right after a
# marker line
#     <!-- output-of: COMMAND -->            or
#     <!-- output-of: COMMAND ; ignore: ERE -->
# is what COMMAND (run from the repository root, stdout and stderr together) prints: every
# line of the block must be a line of the output, in any order (lines starting with "$ "
# show the command and are not compared; neither are empty lines). Before comparing, both
# sides have their timings ("1.234 ms/step", "12.3 s") masked, and whatever ERE matches,
# and trailing blanks cut.
# A block whose program is not built is skipped (one line says which). Run by make test;
# prints one zt summary line like the C tests. README=FILE checks another file.
set -u
cd "$(dirname "$0")/.."
readme=${README:-README.md}
passed=0; failed=0; skipped=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/zt-readme.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT

# Split the README into block files: N.cmd (the command), N.ign (the extra ERE), N.exp.
awk -v dir="$tmp" '
  /^<!-- output-of: .* -->/ {
    line = $0; sub(/.*<!-- output-of: /, "", line); sub(/ -->.*/, "", line)
    ign = ""; k = index(line, " ; ignore: ")
    if (k > 0) { ign = substr(line, k + 11); line = substr(line, 1, k - 1) }
    n++; printf "%s\n", line > (dir "/" n ".cmd"); printf "%s\n", ign > (dir "/" n ".ign")
    want = 1; next
  }
  want == 1 && /^```/ { inblock = 1; want = 0; printf "" > (dir "/" n ".exp"); next }
  inblock && /^```/ { inblock = 0; next }
  inblock { print > (dir "/" n ".exp") }
' "$readme"

mask() { # stdin -> stdout: timings and the block's own ERE replaced by "#", trailing blanks cut
  if [ -n "$1" ]; then sed -E -e 's/[0-9]+(\.[0-9]+)? (ms\/step|ms|s)\b/# \2/g' -e "s/$1/#/g" -e 's/[[:space:]]+$//'
  else sed -E -e 's/[0-9]+(\.[0-9]+)? (ms\/step|ms|s)\b/# \2/g' -e 's/[[:space:]]+$//'; fi
}

for cmdf in $(ls "$tmp"/*.cmd 2>/dev/null | sort -V); do
  n=$(basename "$cmdf" .cmd); cmd=$(cat "$cmdf"); ign=$(cat "$tmp/$n.ign")
  prog=${cmd%% *}
  if [ ! -f "$tmp/$n.exp" ]; then echo "FAIL block $n ($cmd): no fenced block after the marker"; failed=$((failed + 1)); continue; fi
  if [ ! -x "$prog" ]; then echo "skip block $n: $prog is not built ($cmd)"; skipped=$((skipped + 1)); continue; fi
  bash -c "$cmd" > "$tmp/$n.out" 2>&1
  mask "$ign" < "$tmp/$n.out" > "$tmp/$n.mout"
  missing=""; lines=0
  while IFS= read -r want; do
    case "$want" in ''|'$ '*) continue ;; esac
    lines=$((lines + 1))
    w=$(printf '%s\n' "$want" | mask "$ign")
    if ! grep -Fxq -- "$w" "$tmp/$n.mout"; then missing=$want; break; fi
  done < "$tmp/$n.exp"
  if [ -z "$missing" ] && [ "$lines" -gt 0 ]; then echo "ok   block $n: $cmd ($lines lines)"; passed=$((passed + 1))
  else
    echo "FAIL block $n: $cmd"
    if [ -n "$missing" ]; then echo "  README line not in the output: $missing"; else echo "  the block is empty"; fi
    echo "  the output:"; sed 's/^/    /' "$tmp/$n.out" | head -n 20
    failed=$((failed + 1))
  fi
done
echo "zt: $passed passed, $failed failed, $skipped skipped"
[ $failed -eq 0 ]
