#!/usr/bin/env bash
# docs/check-index.sh - docs/README.md is the index of every document: each
# tracked Markdown file and man page must appear in it (a document of
# docs/bench-notes/ through that folder's entry), and each of its links must
# lead to a file that exists. Run by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
index=docs/README.md
bad=0
listed=0
mapfile -t docs < <(git ls-files '*.md' 'deploy/man/*' 2>/dev/null ||
  find . -path ./build -prune -o \( -name '*.md' -o -path './deploy/man/*' \) -type f -print | sed 's|^\./||')
for doc in "${docs[@]}"; do
  case $doc in
  "$index" | */node_modules/*) continue ;;
  docs/bench-notes/*) want='](bench-notes/)' ;;
  docs/*) want="](${doc#docs/})" ;;
  deploy/man/*) want="\`$doc\`" ;;
  *) want="](../$doc)" ;;
  esac
  if grep -qF -- "$want" "$index"; then
    listed=$((listed + 1))
  else
    echo "check-index: $index does not list $doc (expected $want)" >&2
    bad=1
  fi
done
# every relative link of the index leads somewhere
while read -r link; do
  target=${link%%#*}
  [ -e "docs/$target" ] || { echo "check-index: $index links to missing $target" >&2; bad=1; }
done < <(grep -o '](\([^)]*\))' "$index" | sed 's/^](//; s/)$//' | grep -v '^[a-z]*://')
[ $bad = 0 ] || exit 1
echo "check-index: $index lists all $listed documents"
