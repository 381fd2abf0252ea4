#!/bin/sh
# Checks a staged `make install` (mk/install.mk, `make check-install`).
#
#   check_install.sh installed   DESTDIR PREFIX VERSION FILE...   every FILE (relative to PREFIX)
#                                 is there and nothing else; the installed CLI prints VERSION and
#                                 finds the installed library; pkg-config reads the .pc (when
#                                 pkg-config is installed); a program built with its flags against
#                                 the installed header and library gets VERSION from
#                                 poolshim_version() (not with SANITIZE: an instrumented library
#                                 cannot be loaded into a plain program)
#   check_install.sh uninstalled DESTDIR PREFIX                    no file is left under DESTDIR
#
# Environment: CC (default cc), SANITIZE (non-empty: skip the link test).
# Exit status 0 when every check passed; each failure is printed as "check-install: FAIL: ...".
set -u
mode=$1 dest=$2 prefix=$3
root=$dest$prefix
failures=0
fail() { echo "check-install: FAIL: $*" >&2; failures=$((failures + 1)); }
ok() { echo "check-install: ok: $*"; }

if [ "$mode" = uninstalled ]; then
    left=$(find "$dest" ! -type d 2>/dev/null)
    if [ -n "$left" ]; then fail "files left after make uninstall:"; echo "$left" >&2; else ok "uninstall left no file under $dest"; fi
    [ ! -e "$root/share/poolshim" ] || fail "uninstall left $root/share/poolshim"
    [ ! -e "$root/include/poolshim" ] || fail "uninstall left $root/include/poolshim"
    [ ! -e "$root/lib/poolshim" ] || fail "uninstall left $root/lib/poolshim"
    [ "$failures" -eq 0 ]
    exit
fi

version=$4
shift 4
expected=$(for f in "$@"; do echo "$f"; done | sort)
present=$(cd "$root" 2>/dev/null && find . ! -type d | sed 's|^\./||' | sort)
for f in "$@"; do [ -f "$root/$f" ] || fail "not installed: $prefix/$f"; done
extra=$(echo "$present" | while read -r f; do
    [ -z "$f" ] && continue
    echo "$expected" | grep -qxF "$f" || echo "$f"
done)
[ -z "$extra" ] || fail "installed but not expected (and so not uninstalled): $extra"
[ "$failures" -eq 0 ] && ok "$# files installed under $prefix, and no other"

# the installed CLI
out=$("$root/bin/poolshim" --version 2>&1)
[ "$out" = "poolshim $version" ] && ok "installed poolshim --version: $out" || fail "installed poolshim --version printed '$out', expected 'poolshim $version'"
out=$("$root/bin/poolshim" run --dry-run -- true 2>&1)
echo "$out" | grep -qF "$root/lib/libpoolshim.so" && ok "installed poolshim run preloads the installed $prefix/lib/libpoolshim.so" \
    || fail "installed poolshim run does not preload the installed library: $out"
[ -x "$root/lib/libpoolshim.so" ] || fail "$prefix/lib/libpoolshim.so is not executable"

# the SPANK plugin finds the library and the CLI from where it lies (tools/slurm/spank_poolshim.c)
if [ -f "$root/lib/poolshim/spank_poolshim.so" ]; then
    [ -f "$root/lib/poolshim/../libpoolshim.so" ] && [ -x "$root/lib/poolshim/../../bin/poolshim" ] \
        && ok "the SPANK plugin's ../libpoolshim.so and ../../bin/poolshim are installed" \
        || fail "the SPANK plugin's ../libpoolshim.so or ../../bin/poolshim is missing"
fi

# the installed Prometheus rules pass their installed unit tests
if command -v promtool >/dev/null; then
    out=$(cd "$root/share/poolshim/prometheus" && promtool test rules poolshim.rules.test.yml 2>&1)
    [ $? -eq 0 ] && ok "promtool test rules in $prefix/share/poolshim/prometheus" || fail "promtool test rules: $out"
fi

# man pages and completion
for page in man1/poolshim.1 man7/poolshim.7; do
    f=$root/share/man/$page
    grep -q '@VERSION@' "$f" && fail "$page: @VERSION@ was not replaced"
    grep -q "poolshim $version" "$f" || fail "$page does not name poolshim $version"
    if command -v groff >/dev/null; then
        warnings=$(groff -man -ww -z "$f" 2>&1)
        [ -z "$warnings" ] && ok "$page formats without warnings" || fail "$page: groff: $warnings"
    fi
done
if command -v bash >/dev/null; then
    words=$(bash -c ". '$root/share/bash-completion/completions/poolshim' && COMP_WORDS=(poolshim re) COMP_CWORD=1 && _poolshim && echo \${COMPREPLY[*]}" 2>&1)
    [ "$words" = "replay" ] && ok "bash completion: 'poolshim re' -> $words" || fail "bash completion of 'poolshim re' gave '$words'"
fi

# pkg-config over the staged .pc
pc_dir=$root/lib/pkgconfig
grep -qx "prefix=$prefix" "$pc_dir/poolshim.pc" || fail "poolshim.pc: prefix is not $prefix"
if command -v pkg-config >/dev/null; then
    got=$(PKG_CONFIG_PATH=$pc_dir PKG_CONFIG_LIBDIR=$pc_dir pkg-config --modversion poolshim 2>&1)
    [ "$got" = "$version" ] && ok "pkg-config --modversion poolshim: $got" || fail "pkg-config --modversion poolshim gave '$got'"
    flags=$(PKG_CONFIG_PATH=$pc_dir PKG_CONFIG_LIBDIR=$pc_dir pkg-config --cflags --libs poolshim 2>&1 | xargs)
    [ "$flags" = "-I$prefix/include -L$prefix/lib -lpoolshim" ] && ok "pkg-config --cflags --libs poolshim: $flags" \
        || fail "pkg-config --cflags --libs gave '$flags'"
    if [ -z "${SANITIZE:-}" ]; then
        # a program built as a user would: the installed header and the .pc's flags (under DESTDIR)
        tmp=$(mktemp -d)
        cat > "$tmp/use.c" <<'PROG'
#include <poolshim/poolshim.h>
#include <stdio.h>
int main(void) { puts(poolshim_version()); return 0; }
PROG
        sysflags=$(PKG_CONFIG_PATH=$pc_dir PKG_CONFIG_LIBDIR=$pc_dir PKG_CONFIG_SYSROOT_DIR=$dest pkg-config --cflags --libs poolshim)
        # shellcheck disable=SC2086
        if ${CC:-cc} -o "$tmp/use" "$tmp/use.c" $sysflags 2>"$tmp/err"; then
            got=$(LD_LIBRARY_PATH=$root/lib "$tmp/use" 2>&1)
            [ "$got" = "$version" ] && ok "a program built with pkg-config's flags: poolshim_version() = $got" \
                || fail "poolshim_version() of the installed library returned '$got'"
        else
            fail "building against the installed header and .pc failed: $(cat "$tmp/err")"
        fi
        rm -rf "$tmp"
    fi
else
    echo "check-install: skip: pkg-config is not installed (make deps installs it)"
fi

[ "$failures" -eq 0 ] || { echo "check-install: $failures failures" >&2; exit 1; }
