#!/usr/bin/env bash
# Checks that the repository stands alone: every relative link in a Markdown
# file resolves to a file inside the repository, and no tracked file points
# at the sibling folder the project was developed beside (../shared/).
set -euo pipefail
cd "$(dirname "$0")/.."
fail=0
if git grep -n -I -e '\.\./shared/' -e '/work/shared' -- . ':!scripts/check-standalone.sh'; then
  echo "check-standalone: the files above refer to a path outside the repository"
  fail=1
fi
root=$PWD
while IFS= read -r md; do
  dir=$(dirname "$md")
  # [text](target) with a relative target; anchors and URLs are skipped
  for target in $(grep -oE '\]\([^)#[:space:]]+' "$md" | sed 's/^](//' |
                    grep -vE '^(https?|mailto|ftp):' || true); do
    path=$(realpath -m "$dir/$target")
    case "$path" in
      "$root"/*) ;;
      *) echo "check-standalone: $md links outside the repository: $target"; fail=1; continue ;;
    esac
    [ -e "$path" ] || { echo "check-standalone: $md links to a missing file: $target"; fail=1; }
  done
done < <(git ls-files '*.md' ':!tests/s3/node_modules')
[ "$fail" = 0 ] && echo "check-standalone: every Markdown link resolves inside the repository"
exit "$fail"
