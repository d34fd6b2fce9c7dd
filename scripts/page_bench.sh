#!/usr/bin/env bash
# The memory page of a 1,000,000-event trace: the size of the page `syncmem trace view` writes,
# the time it takes to write it, and the time headless Chromium takes to load and draw it,
# against a one-line page loaded by the same browser in the same run (the browser's own start).
#
#     scripts/page_bench.sh [EVENTS]      (EVENTS: 1000000 by default)
#
# Needs python3 and chromium (or $SYNCMEM_CHROMIUM); builds the release binary. Prints one line
# per figure. Goals: a page under 20 MB, drawn in under 3 s.
set -euo pipefail
cd "$(dirname "$0")/.."
events="${1:-1000000}"
browser="${SYNCMEM_CHROMIUM:-$(command -v chromium || command -v chromium-browser)}"
cargo build --release -q -p syncmem-cli
bin="${CARGO_TARGET_DIR:-target}/release/syncmem"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
python3 scripts/make_large_trace.py "$dir/trace.jsonl" "$events" >/dev/null

now() { date +%s.%N; }
t0=$(now)
"$bin" trace view "$dir/trace.jsonl" -o "$dir/page.html" >/dev/null
t1=$(now)
echo '<!DOCTYPE html><html><body data-ready="1">x</body></html>' >"$dir/one.html"

# Loads a page headless, draws it into a screenshot, and prints the seconds it took, start to
# exit. (A screenshot, not --dump-dom: printing the DOM of a page that embeds megabytes of data
# costs more than drawing it.)
load() {
  local a b
  a=$(now)
  "$browser" --headless --no-sandbox --disable-gpu --no-first-run --disable-background-networking \
    --window-size=1280,800 --user-data-dir="$dir/profile" --screenshot="$dir/shot.png" \
    "file://$1" >/dev/null 2>&1
  b=$(now)
  echo "$b - $a" | bc -l
}
base=$(load "$dir/one.html")
full=$(load "$dir/page.html")
# The page's own figures (its script's time, its errors) from its DOM.
"$browser" --headless --no-sandbox --disable-gpu --no-first-run --disable-background-networking \
  --window-size=1280,800 --user-data-dir="$dir/profile" --dump-dom "file://$dir/page.html" \
  >"$dir/dom.html" 2>/dev/null
errors=$(grep -o 'data-errors="[0-9]*"' "$dir/dom.html" | grep -o '[0-9]*' || echo "?")
loaded=$(grep -o 'data-loaded-ms="[0-9.]*"' "$dir/dom.html" | grep -o '[0-9.]*' || echo "?")
size=$(stat -c %s "$dir/page.html")
printf 'trace events                          %d\n' "$(wc -l <"$dir/trace.jsonl")"
printf 'page size                             %.2f MB (goal: under 20 MB)\n' "$(echo "$size / 1000000" | bc -l)"
printf 'syncmem trace view (write the page)   %.2f s\n' "$(echo "$t1 - $t0" | bc -l)"
printf 'chromium: a one-line page             %.2f s (the browser starting)\n' "$base"
printf 'chromium: the page, drawn             %.2f s (goal: under 3 s)\n' "$full"
printf 'the page beyond the one-line page     %.2f s\n' "$(echo "$full - $base" | bc -l)"
printf 'request to end of the page script     %s ms (data-loaded-ms)\n' "$loaded"
printf 'script errors                         %s\n' "$errors"
