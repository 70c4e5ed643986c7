#!/usr/bin/env bash
# Installs s3rver (pinned by package-lock.json) into tests/s3/node_modules so
# the S3-tier tests (tests/test_s3*.c) can run a real S3-compatible server on
# loopback. Needs node >= 16 and npm; does nothing when already installed.
set -euo pipefail
cd "$(dirname "$0")"
if [ -x node_modules/.bin/s3rver ] && [ node_modules/.package-lock.json -nt package-lock.json ]; then
  echo "tests/s3: s3rver already installed"
  exit 0
fi
command -v npm >/dev/null || { echo "tests/s3: npm not found (install nodejs and npm)" >&2; exit 1; }
npm ci --no-audit --no-fund --loglevel=error
echo "tests/s3: installed s3rver $(node -p 'require("s3rver/package.json").version')"
