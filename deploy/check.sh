#!/usr/bin/env bash
# deploy/check.sh - checks in CI what can be checked of deploy/ without a
# real host: install tree and pkg-config, --help, man pages (kcache.1 against
# the option tables, both ways) and shell completion, the example
# config through kcached --check-config, the systemd unit (systemd-analyze),
# the nginx example (nginx -t, then a live TLS proxy to a real kcached), and
# the Dockerfile's package names. Usage: deploy/check.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD
BUILD=${1:-build}
[ -d "$BUILD" ] || { echo "check.sh: no build directory '$BUILD' (build first)" >&2; exit 1; }
BUILD=$(cd "$BUILD" && pwd)

passed=0
skipped=0
pass() { echo "ok   - $*"; passed=$((passed + 1)); }
skip() { echo "skip - $*"; skipped=$((skipped + 1)); }
fail() { echo "FAIL - $*" >&2; exit 1; }

T=$(mktemp -d /tmp/kc-deploy-check.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$T"
}
trap cleanup EXIT

# --- 1. install tree ------------------------------------------------------
P=$T/prefix
cmake --install "$BUILD" --prefix "$P" >"$T/install.log" 2>&1 || { cat "$T/install.log"; fail "cmake --install"; }
LIBDIR=$(dirname "$(find "$P" -name kcache.pc -path '*pkgconfig*' | head -1)")
[ -n "$LIBDIR" ] && [ "$LIBDIR" != . ] || fail "kcache.pc not installed"
LIBDIR=$(dirname "$LIBDIR")
for f in bin/kcache bin/kcached include/kcache/kc_store.h include/kcache/kc_remote.h \
         include/kcache/kc_envelope.h include/kcache/kc_error.h include/kcache/kc_onnx.h \
         include/kcache/kc_kernel.h share/man/man1/kcache.1 \
         share/man/man8/kcached.8 lib/systemd/system/kcached.service \
         share/doc/kcache/examples/kcached.conf share/bash-completion/completions/kcache \
         share/zsh/site-functions/_kcache; do
  [ -e "$P/$f" ] || fail "cmake --install did not install $f"
done
for l in libkccore.a libkcremote.a libkccompiler.a libkconnx.a libkcache.so; do
  [ -f "$LIBDIR/$l" ] || fail "cmake --install did not install $l"
done
if find "$P/include" -name '*_internal.h' | grep -q .; then fail "internal headers installed"; fi
pass "cmake --install puts binaries, libraries, headers, kcache.pc, man pages, completion, unit in place"

# --- 2. pkg-config: compile, link and run a program against the install ----
export PKG_CONFIG_PATH=$LIBDIR/pkgconfig
flags=$(pkg-config --cflags --libs kcache) || fail "pkg-config --cflags --libs kcache"
# headers are included as <kcache/kc_x.h>: Cflags name the include root, not include/kcache
incdirs=$(for i in $(pkg-config --cflags-only-I kcache); do readlink -f "${i#-I}"; done)
root=$(readlink -f "$P/include")
grep -qx "$root" <<<"$incdirs" && ! grep -qx "$root/kcache" <<<"$incdirs" ||
  fail "kcache.pc Cflags are not the include root: $(pkg-config --cflags-only-I kcache)"
[ "$(pkg-config --modversion kcache)" = "$(sed -n 's/^project(kcache VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)" ] ||
  fail "kcache.pc version differs from the project version"
cat >"$T/use.c" <<'EOF'
#include <kcache/kc_remote.h>
#include <kcache/kc_store.h>
#include <stdio.h>
int main(int argc, char **argv)
{
    kc_err err;
    kc_store *s;
    if (argc < 2 || kc_store_open(argv[1], NULL, &s, &err) != KC_OK)
        return 1;
    kc_remote *r;
    if (kc_remote_open("http://127.0.0.1:1", NULL, &r, &err) != KC_OK)
        return 1;
    kc_remote_close(r);
    kc_store_close(s);
    puts("linked");
    return 0;
}
EOF
# shellcheck disable=SC2086
cc -std=c11 -Wall -Werror "$T/use.c" -o "$T/use" $flags || fail "compile+link against kcache.pc"
[ "$(LD_LIBRARY_PATH=$LIBDIR "$T/use" "$T/store")" = linked ] || fail "program linked through kcache.pc does not run"
# Moving the install tree keeps kcache.pc valid (prefix relative to the file).
mv "$P" "$T/moved"
PKG_CONFIG_PATH=${LIBDIR/$P/$T/moved}/pkgconfig pkg-config --cflags kcache | grep -q "$T/moved" ||
  fail "kcache.pc is not relocatable"
mv "$T/moved" "$P"
pass "pkg-config --cflags --libs kcache builds and runs a client on libkcache.so (relocatable prefix)"

# --- 2a. the static libraries with their headers, e.g. the ONNX importer ------
# (kc_onnx.h and libkconnx.a are installed together: a program built from them
# alone, with their system libraries, loads a real model and refuses a bad one)
cat >"$T/onnx.c" <<'EOF'
#include <kcache/kc_onnx.h>
#include <stdio.h>
int main(int argc, char **argv)
{
    kc_err err = {0};
    kc_graph *g = NULL;
    if (argc != 3 || kc_onnx_load(argv[1], NULL, &g, &err) != KC_OK)
        return fprintf(stderr, "onnx: %s\n", err.msg), 1;
    printf("nodes %d\n", g->n_nodes);
    kc_graph_free(g);
    if (kc_onnx_load(argv[2], NULL, &g, &err) == KC_OK)
        return 1;
    printf("refused: %s\n", err.msg);
    return 0;
}
EOF
onnx_model=/usr/share/libonnx-testdata/data/node/test_relu/model.onnx
[ -f "$onnx_model" ] || fail "$onnx_model missing (libonnx-testdata, scripts/setup.sh)"
# shellcheck disable=SC2046
cc -std=c11 -Wall -Wextra -Werror "$T/onnx.c" -o "$T/onnx" -I"$P/include" -L"$LIBDIR" -lkconnx \
  -lkccompiler -lkccore $(pkg-config --libs libprotobuf-c jansson sqlite3 libzstd libcrypto nettle libxxhash) \
  -ldnnl -lze_loader -ldl -lm -pthread || fail "no program builds on the installed kc_onnx.h + libkconnx.a"
echo "not a model" >"$T/bad.onnx"
"$T/onnx" "$onnx_model" "$T/bad.onnx" >"$T/onnx.out" 2>&1 && grep -q '^nodes 1$' "$T/onnx.out" &&
  grep -q '^refused: ' "$T/onnx.out" || { cat "$T/onnx.out"; fail "the program on libkconnx.a did not load and refuse"; }
pass "the installed kc_onnx.h and libkconnx.a build a program that loads an ONNX model"

# --- 2b. the GUIDE's libkcache.so example, against a live kcached ------------
sed -n '/<!-- libkcache-example -->/,/^```$/p' docs/GUIDE.md | sed '1,2d;$d' >"$T/example.c"
[ -s "$T/example.c" ] || fail "no libkcache example in docs/GUIDE.md"
[ -L "$LIBDIR/libkcache.so" ] && [ -f "$(readlink -f "$LIBDIR/libkcache.so")" ] ||
  fail "cmake --install did not install libkcache.so"
soname=$(objdump -p "$LIBDIR/libkcache.so" | awk '/SONAME/ {print $2}')
[[ $soname =~ ^libkcache\.so\.[0-9]+\.[0-9]+$ ]] && [ -e "$LIBDIR/$soname" ] ||
  fail "libkcache.so has no versioned soname ($soname)"
# shellcheck disable=SC2086
cc -std=c11 -Wall -Wextra -Werror "$T/example.c" -o "$T/example" $(pkg-config --cflags --libs kcache) ||
  fail "the GUIDE's example does not build against the installed libkcache.so"
objdump -p "$T/example" | grep -q "NEEDED *$soname" || fail "the example does not link $soname"
"$P/bin/kcached" --listen 127.0.0.1:0 --port-file "$T/ex.port" --data "$T/ex-data" \
  --log-level warn >"$T/ex-kcached.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 200); do [ -s "$T/ex.port" ] && break; sleep 0.05; done
[ -s "$T/ex.port" ] || { cat "$T/ex-kcached.log"; fail "kcached did not start"; }
EXURL=http://127.0.0.1:$(cat "$T/ex.port")
# one artifact on the server that the example's cache lacks
echo "from the server" >"$T/ex-payload"
"$P/bin/kcache" --cache-dir "$T/ex-seed" put --kind blob "$T/ex-payload" >/dev/null &&
  "$P/bin/kcache" --cache-dir "$T/ex-seed" --remote "$EXURL" push >"$T/ex-push.log" 2>&1 ||
  fail "could not seed the example's server"
LD_LIBRARY_PATH=$LIBDIR "$T/example" "$T/ex-cache" "$EXURL" >"$T/example.out" 2>&1 ||
  { cat "$T/example.out"; fail "the GUIDE's example failed"; }
grep -q '^got hello back$' "$T/example.out" && grep -q '^pulled 1 new artifacts from ' "$T/example.out" ||
  { cat "$T/example.out"; fail "the GUIDE's example printed something else"; }
pass "the GUIDE's example builds against libkcache.so ($soname) and puts, gets and pulls"

# --- 3. --help, man pages and completion --------------------------------------
"$P/bin/kcached" --help >"$T/kcached.help" || fail "kcached --help"
for opt in $(grep -o '^  --[a-z-]*' "$T/kcached.help" | tr -d ' '); do
  grep -q -- "${opt//-/\\\\-}" deploy/man/kcached.8 || fail "kcached.8 does not document $opt"
done
# kcache.1 against the option tables, both ways: every option of `kcache --help` and
# of each `kcache COMMAND --help` and `kcache help COMMAND SUB` (the tables that parse them) has an entry in the man
# page (a .TP entry naming it), and every option entry there is in a table; the same
# for the environment variables (--help's settings and environment sections against
# ENVIRONMENT's entries) and the configuration keys (kcache config against
# CONFIGURATION).
export XDG_CONFIG_HOME=$T/no-config
K=$P/bin/kcache
"$K" --help >"$T/kcache.help" || fail "kcache --help"
cmds=$(sed -n '/^commands:/,/^$/p' "$T/kcache.help" | awk 'NF>1 {print $1}')
[ -n "$cmds" ] || fail "kcache --help lists no commands"
{
  sed -n '/^global options/,/^$/p' "$T/kcache.help"
  for cmd in $cmds; do
    "$K" "$cmd" --help >"$T/cmd.help" || fail "kcache $cmd --help"
    cat "$T/cmd.help"
    # a command with subcommands (dir): each one's table
    for sub in $(sed -n 's/^subcommands: \([a-z ]*\) (.*/\1/p' "$T/cmd.help"); do
      "$K" help "$cmd" "$sub" || fail "kcache help $cmd $sub"
    done
  done
} >"$T/all.help"
table_opts=$(grep -o '^  \(-[a-z], \)\?--[a-z][a-z-]*' "$T/all.help" | grep -o -- '--[a-z-]*' | sort -u)
table_short=$(grep -o '^  -[a-z],' "$T/all.help" | tr -d ' ,' | sort -u)
man_entries=$(awk '/^\.TP/ {getline; print}' deploy/man/kcache.1 | sed 's/\\-/-/g')
man_opts=$(grep -o -- '--[a-z][a-z-]*' <<<"$man_entries" | sort -u)
for o in $table_opts; do
  grep -qx -- "$o" <<<"$man_opts" || fail "kcache.1 has no entry for $o (kcache --help or a command's)"
done
for o in $man_opts; do
  grep -qx -- "$o" <<<"$table_opts" || fail "kcache.1 documents $o, which no option table has"
done
for o in $table_short; do
  grep -q -- "${o//-/\\\\-}" deploy/man/kcache.1 || fail "kcache.1 does not document $o"
done
for cmd in $cmds; do
  grep -q "$cmd" deploy/man/kcache.1 || fail "kcache.1 does not document the $cmd command"
done
help_env=$(sed -n '/^settings:/,/^kcache help/p' "$T/kcache.help" | awk '$1 ~ /^[A-Z][A-Z0-9_]+$/ {print $1}' | sort -u)
man_env=$(sed -n '/^\.SH ENVIRONMENT/,/^\.SH [A-DF-Z]/p' deploy/man/kcache.1 |
          awk '/^\.TP/ {getline; print $2}' | sort -u)
[ -n "$help_env" ] || fail "kcache --help lists no environment variables"
for v in $help_env; do
  grep -qx "$v" <<<"$man_env" || fail "kcache.1's ENVIRONMENT has no entry for $v"
done
for v in $man_env; do
  grep -qx "$v" <<<"$help_env" || fail "kcache.1 documents $v, which kcache --help does not list"
done
keys=$(HOME=$T "$K" --cache-dir "$T/cfg-cache" config | sed -n 's/^([^)]*) \([a-z-]*\) =.*/\1/p')
[ "$(wc -w <<<"$keys")" -ge 11 ] || fail "kcache config printed too few settings: $keys"
conf_section=$(sed -n '/^\.SH CONFIGURATION/,/^\.SH /p' deploy/man/kcache.1)
for k in $keys; do
  grep -q -- "$k" <<<"$conf_section" || fail "kcache.1's CONFIGURATION does not name the key $k"
done
for section in EXAMPLES FILES CONFIGURATION ENVIRONMENT; do
  grep -q "^\.SH $section" deploy/man/kcache.1 || fail "kcache.1 has no $section section"
done
unset XDG_CONFIG_HOME
if command -v groff >/dev/null; then
  for m in deploy/man/kcache.1 deploy/man/kcached.8; do
    w=$(LC_ALL=C.UTF-8 groff -man -Tutf8 -ww -z "$m" 2>&1)
    [ -z "$w" ] || fail "groff warnings in $m: $w"
  done
  pass "kcache.1 and the option tables name the same $(wc -w <<<"$table_opts") options and $(wc -w <<<"$help_env") variables; man pages render without warnings"
else
  pass "kcache.1 and the option tables name the same options and variables (groff missing: rendering not checked)"
fi
# the installed completion is what the tool prints, and loads
BC=$P/share/bash-completion/completions/kcache
cmp -s "$BC" <("$K" completion bash) || fail "installed bash completion differs from kcache completion bash"
bash -n "$BC" || fail "bash -n $BC"
[ "$(bash --norc -c "source '$BC' && complete -p kcache")" = "complete -F _kcache kcache" ] ||
  fail "sourcing $BC does not register the completion"
if command -v zsh >/dev/null; then
  zsh -n "$P/share/zsh/site-functions/_kcache" || fail "zsh -n _kcache"
  pass "bash and zsh completion installed, generated by kcache completion, and parse"
else
  pass "bash completion installed and parses (zsh missing: _kcache not parsed)"
fi

# --- 4. the example config through kcached's own parser --------------------
"$P/bin/kcached" --config deploy/kcached.conf --check-config --tokens deploy/tokens.example \
  --data "$T/data" >"$T/check.out" 2>&1 || { cat "$T/check.out"; fail "kcached --check-config deploy/kcached.conf"; }
grep -q '^max-size = 53687091200$' "$T/check.out" || fail "--check-config did not read deploy/kcached.conf"
# and a broken copy is refused, naming the line
sed 's/^max-size = .*/max-size = lots/' deploy/kcached.conf >"$T/bad.conf"
if "$P/bin/kcached" --config "$T/bad.conf" --check-config --data "$T/data" >"$T/bad.out" 2>&1; then
  fail "kcached --check-config accepted max-size = lots"
fi
grep -q "bad.conf:[0-9]*" "$T/bad.out" || fail "--check-config error does not name file:line: $(cat "$T/bad.out")"
pass "deploy/kcached.conf and tokens.example pass kcached --check-config; a bad value is refused"
# the commented S3 block too, once kcached has the tier
if grep -q -- '--s3-endpoint' "$T/kcached.help"; then
  sed 's/^# \(s3-[a-z-]* = \)/\1/; s|^s3-credentials = .*||' deploy/kcached.conf >"$T/s3.conf"
  AWS_ACCESS_KEY_ID=AKIDEXAMPLE AWS_SECRET_ACCESS_KEY=example "$P/bin/kcached" --config "$T/s3.conf" \
    --check-config --tokens deploy/tokens.example --data "$T/data" >"$T/s3.out" 2>&1 ||
    { cat "$T/s3.out"; fail "kcached --check-config with the S3 block of deploy/kcached.conf"; }
  grep -q '^s3-bucket = my-kcache-bucket$' "$T/s3.out" || fail "--check-config ignored the s3-* settings"
  pass "the S3 block of deploy/kcached.conf passes kcached --check-config"
else
  skip "kcached has no S3 tier yet: s3-* example settings not checked"
fi

# --- 5. systemd unit --------------------------------------------------------
UNIT=$P/lib/systemd/system/kcached.service
if command -v systemd-analyze >/dev/null; then
  # verify checks that ExecStart exists (the installed binary) and that the
  # Documentation= man page resolves.
  MANPATH=$P/share/man: SYSTEMD_LOG_LEVEL=notice systemd-analyze verify "$UNIT" >"$T/verify.out" 2>&1 ||
    { cat "$T/verify.out"; fail "systemd-analyze verify kcached.service"; }
  if grep -v 'ConditionPathExists' "$T/verify.out" | grep -q .; then
    cat "$T/verify.out"
    fail "systemd-analyze verify printed warnings"
  fi
  if systemd-analyze security --help 2>/dev/null | grep -q -- --offline; then
    systemd-analyze security --offline=yes --threshold=20 "$UNIT" >"$T/security.out" 2>&1 ||
      { tail -3 "$T/security.out"; fail "kcached.service exposure above 2.0"; }
    score=$(grep -o 'Overall exposure level for [^:]*: [0-9.]*' "$T/security.out" | awk '{print $NF}')
    pass "systemd-analyze verify kcached.service; security exposure $score (threshold 2.0)"
  else
    pass "systemd-analyze verify kcached.service (no offline security scoring here)"
  fi
else
  skip "systemd-analyze not installed: unit not verified (apt-get install systemd)"
fi

# --- 6. nginx example: syntax, then a live TLS proxy to a real kcached -------
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
if command -v nginx >/dev/null && command -v openssl >/dev/null && command -v python3 >/dev/null; then
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$T/tls.key" -out "$T/tls.crt" -days 1 \
    -subj /CN=kcache.test >/dev/null 2>&1 || fail "openssl could not make a test certificate"
  "$P/bin/kcached" --listen 127.0.0.1:0 --port-file "$T/kcached.port" --data "$T/data" \
    --log-level warn >"$T/kcached.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 200); do [ -s "$T/kcached.port" ] && break; sleep 0.05; done
  [ -s "$T/kcached.port" ] || { cat "$T/kcached.log"; fail "kcached did not start"; }
  KPORT=$(cat "$T/kcached.port")
  HTTP_PORT=$(free_port)
  HTTPS_PORT=$(free_port)
  sed -e "s|/etc/ssl/kcache/fullchain.pem|$T/tls.crt|; s|/etc/ssl/kcache/privkey.pem|$T/tls.key|" \
      -e "s|server 127.0.0.1:7070|server 127.0.0.1:$KPORT|" \
      -e "s|listen 80;|listen 127.0.0.1:$HTTP_PORT;|; s|listen \[::\]:80;||" \
      -e "s|listen 443 ssl http2;|listen 127.0.0.1:$HTTPS_PORT ssl http2;|; s|listen \[::\]:443 ssl http2;||" \
      deploy/nginx-kcache.conf >"$T/site.conf"
  cat >"$T/nginx.conf" <<EOF
pid $T/nginx.pid;
error_log $T/nginx-error.log;
daemon off;
worker_processes 1;
events {}
http {
  access_log off;
  client_body_temp_path $T/ngx-body;
  proxy_temp_path $T/ngx-proxy;
  fastcgi_temp_path $T/ngx-fastcgi;
  uwsgi_temp_path $T/ngx-uwsgi;
  scgi_temp_path $T/ngx-scgi;
  include $T/site.conf;
}
EOF
  nginx -t -p "$T" -c "$T/nginx.conf" >"$T/nginx-t.out" 2>&1 || { cat "$T/nginx-t.out"; fail "nginx -t on deploy/nginx-kcache.conf"; }
  nginx -p "$T" -c "$T/nginx.conf" 2>"$T/nginx.err" &
  PIDS+=($!)
  code=000
  for _ in $(seq 100); do
    code=$(curl -sk -o "$T/healthz" -w '%{http_code}' "https://127.0.0.1:$HTTPS_PORT/healthz" 2>/dev/null || true)
    [ "$code" = 200 ] && break
    sleep 0.1
  done
  [ "$code" = 200 ] || { cat "$T/nginx.err" "$T/nginx-error.log" 2>/dev/null; fail "GET https://…/healthz through nginx gave $code"; }
  redirect=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$HTTP_PORT/healthz")
  [ "$redirect" = 301 ] || fail "plain http was not redirected to https ($redirect)"
  pass "nginx -t accepts deploy/nginx-kcache.conf; it proxies TLS to a live kcached"
else
  skip "nginx, openssl or python3 missing: proxy example not checked"
fi

# --- 7. Dockerfile: every package it installs exists in bookworm --------------
if command -v apt-cache >/dev/null; then
  # the words between --no-install-recommends and the next && of each RUN
  pkgs=$(sed -e ':a' -e '/\\$/N; s/\\\n//; ta' deploy/Dockerfile |
         grep -o -- '--no-install-recommends[^&]*' | sed 's/--no-install-recommends//' |
         tr -s ' ' '\n' | grep . | sort -u)
  [ -n "$pkgs" ] || fail "no apt-get install line found in deploy/Dockerfile"
  for pkg in $pkgs; do
    apt-cache show "$pkg" >/dev/null 2>&1 || fail "deploy/Dockerfile installs unknown package $pkg"
  done
  # every library kcached links directly must come from the runtime stage
  runtime=$(sed -n '/^FROM debian:bookworm-slim/,$p' deploy/Dockerfile | sed -e ':a' -e '/\\$/N; s/\\\n//; ta' |
            grep -o -- '--no-install-recommends[^&]*' | sed 's/--no-install-recommends//')
  if command -v objdump >/dev/null && command -v dpkg >/dev/null; then
    for so in $(objdump -p "$P/bin/kcached" | awk '/NEEDED/ {print $2}'); do
      path=$(ldd "$P/bin/kcached" | awk -v so="$so" '$1 == so {print $3}')
      [ -n "$path" ] || continue
      pkg=$( (dpkg -S "$path" || dpkg -S "$(readlink -f "$path")") 2>/dev/null | head -1 | cut -d: -f1 || true)
      [ -z "$pkg" ] || [ "$pkg" = libc6 ] || echo " $runtime " | grep -q " $pkg " ||
        fail "kcached needs $so (package $pkg) but the Dockerfile runtime stage lacks it"
    done
  fi
  grep -q '^FROM debian:bookworm AS build' deploy/Dockerfile || fail "Dockerfile build stage is not bookworm"
  grep -q '^FROM debian:bookworm-slim' deploy/Dockerfile || fail "Dockerfile runtime stage is not bookworm-slim"
  grep -q '^USER ' deploy/Dockerfile || fail "Dockerfile runtime runs as root"
  pass "deploy/Dockerfile: $(echo "$pkgs" | wc -w) packages exist in the archive; multi-stage, non-root"
else
  skip "apt-cache missing: Dockerfile packages not checked"
fi
if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
  skip "docker available but image build left to the release job (minutes of downloads)"
fi

echo "deploy/check.sh: $passed passed, $skipped skipped"
