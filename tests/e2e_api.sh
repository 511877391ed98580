#!/usr/bin/env bash
# End-to-end checks of the library boundary:
#   1. symbols: build/liblamina.a and build/liblamina.so export only lm_
#      names, exactly the LM_API functions of include/lamina.h, and the .so
#      has the soname liblamina.so.0;
#   2. the examples on the bundled model: simple's greedy output is
#      `lamina run --temp 0`'s, batch's output per prompt is each prompt's
#      output alone;
#   3. make install (DESTDIR and PREFIX) installs the program, both
#      libraries, the header and lamina.pc, and examples/simple.c builds with
#      pkg-config against the installed shared library and, with --static,
#      the archive, and both give the same output.
. "$(dirname "$0")/testenv.sh"
BUILD=${BUILD:-build}
L=${LAMINA_BIN:-$BUILD/lamina}

# 1. symbols
sed -n 's/^LM_API[^(]*[ *]\(lm_[a-z0-9_]*\)(.*/\1/p' include/lamina.h | sort >"$T/api"
[ "$(wc -l <"$T/api")" -ge 20 ] && ok api_functions_listed || bad api_functions_listed "$(cat "$T/api")"
nm -g --defined-only "$BUILD/liblamina.a" | awk 'NF == 3 {print $3}' | sort >"$T/a"
nm -D --defined-only "$BUILD/liblamina.so" | awk 'NF == 3 {print $3}' | sort >"$T/so"
for lib in a so; do
    other=$(grep -v '^lm_' "$T/$lib")
    [ -z "$other" ] && ok "only_lm_names_$lib" || bad "only_lm_names_$lib" "$(echo "$other" | head -20)"
    missing=$(comm -23 "$T/api" "$T/$lib")
    [ -z "$missing" ] && ok "every_api_function_exported_$lib" || bad "every_api_function_exported_$lib" "$missing"
    extra=$(comm -13 "$T/api" "$T/$lib")
    [ -z "$extra" ] && ok "nothing_but_the_api_exported_$lib" || bad "nothing_but_the_api_exported_$lib" "$extra"
done
readelf -d "$BUILD/liblamina.so" | grep -q 'SONAME.*\[liblamina\.so\.0\]' && ok soname || bad soname "$(readelf -d "$BUILD/liblamina.so" | grep SONAME)"

# 2. the examples
S=$BUILD/examples/simple
B=$BUILD/examples/batch
prompts=("Once upon a time" "The little dog" "Lily and Ben went to the park")
for i in 0 1 2; do
    p=${prompts[$i]}
    want=$("$L" run -m "$M" -p "$p" --temp 0 -n 60 2>/dev/null)
    got=$("$S" "$M" "$p" 60 2>"$T/err")
    [ -n "$want" ] && [ "$got" == "$want" ] && ok "simple_equals_run_$i" || bad "simple_equals_run_$i" "run:    $want" "simple: $got" "$(cat "$T/err")"
done
"$S" "$M" >/dev/null 2>&1 && ok simple_default_prompt || bad simple_default_prompt
"$S" "$T/missing.gguf" >/dev/null 2>"$T/err"
[ $? -eq 1 ] && grep -q "(io)" "$T/err" && ok simple_missing_model || bad simple_missing_model "$(cat "$T/err")"
"$S" >/dev/null 2>&1
[ $? -eq 2 ] && ok simple_usage || bad simple_usage

: >"$T/alone"
for p in "${prompts[@]}"; do "$S" "$M" "$p" 40 >>"$T/alone" 2>/dev/null; done
if "$B" "$M" -n 40 "${prompts[@]}" >"$T/batch" 2>"$T/err"; then
    grep -v '^=== ' "$T/batch" >"$T/batch_text"
    cmp -s "$T/batch_text" "$T/alone" && ok batch_equals_alone || bad batch_equals_alone "batch:" "$(cat "$T/batch")" "alone:" "$(cat "$T/alone")"
    [ "$(grep -c '^=== ' "$T/batch")" -eq 3 ] && grep -q '^=== 2 ' "$T/batch" && ok batch_one_result_per_prompt \
        || bad batch_one_result_per_prompt "$(cat "$T/batch")"
    grep -q 'sequences per iteration' "$T/err" && ok batch_stats || bad batch_stats "$(cat "$T/err")"
else
    bad batch_runs "$(cat "$T/err")"
fi
"$B" "$M" >"$T/batch4" 2>/dev/null && [ "$(grep -c '^=== ' "$T/batch4")" -eq 4 ] && ok batch_default_prompts \
    || bad batch_default_prompts "$(cat "$T/batch4")"

# 3. make install, then build against the installed library with pkg-config
D=$T/dest
# install what the suite built, never rebuild it here with other flags
keep=(-o "$BUILD/lamina" -o "$BUILD/liblamina.a" -o "$BUILD/liblamina.so" -o "$BUILD/liblamina.so.0")
if make -s install "${keep[@]}" BUILD="$BUILD" DESTDIR="$D" PREFIX=/usr/local >"$T/install.log" 2>&1; then
    ok install_runs
else
    bad install_runs "$(tail -20 "$T/install.log")"
fi
P=$D/usr/local
for f in bin/lamina lib/liblamina.a lib/liblamina.so lib/liblamina.so.0 include/lamina.h lib/pkgconfig/lamina.pc; do
    [ -e "$P/$f" ] && ok "installed_$f" || bad "installed_$f"
done
[ -L "$P/lib/liblamina.so" ] && [ "$(readlink "$P/lib/liblamina.so")" == liblamina.so.0 ] && ok so_symlink || bad so_symlink
grep -q '^prefix=/usr/local$' "$P/lib/pkgconfig/lamina.pc" && ok pc_prefix || bad pc_prefix "$(cat "$P/lib/pkgconfig/lamina.pc")"
export PKG_CONFIG_PATH=$P/lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$D PKG_CONFIG_LIBDIR=$P/lib/pkgconfig
CC=${CC:-cc}
# the sanitizer build's objects need the sanitizer runtime (clang's) at link time
xflags=()
[ -n "${LAMINA_ASAN:-}" ] && CC=clang xflags=(-fsanitize=address,undefined)
libs=$(pkg-config --libs lamina)
slibs=$(pkg-config --static --libs lamina)
[[ "$libs" == *-llamina* && "$libs" != *-lpcre2-8* ]] && ok pc_libs || bad pc_libs "$libs"
[[ "$slibs" == *-llamina*-lpcre2-8*-lmicrohttpd*-lcjson*-lpthread*-lm* ]] && ok pc_libs_static || bad pc_libs_static "$slibs"
want=$("$S" "$M" "Once upon a time" 30 2>/dev/null)
# shared: links liblamina.so from the install, runs with LD_LIBRARY_PATH
if $CC -std=c11 -Wall -Werror "${xflags[@]}" examples/simple.c $(pkg-config --cflags --libs lamina) -o "$T/simple_shared" 2>"$T/err"; then
    ok pkgconfig_shared_builds
    LD_LIBRARY_PATH=$P/lib ldd "$T/simple_shared" | grep -q "liblamina.so.0 => $P/lib/liblamina.so.0" \
        && ok shared_links_installed_so || bad shared_links_installed_so "$(LD_LIBRARY_PATH=$P/lib ldd "$T/simple_shared")"
    got=$(LD_LIBRARY_PATH=$P/lib "$T/simple_shared" "$M" "Once upon a time" 30 2>"$T/err")
    [ -n "$want" ] && [ "$got" == "$want" ] && ok pkgconfig_shared_output || bad pkgconfig_shared_output "$got" "$(cat "$T/err")"
else
    bad pkgconfig_shared_builds "$(cat "$T/err")"
fi
# static: the archive (GNU ld's -l:NAME picks the .a beside the .so), its
# dependencies from Libs.private
if $CC -std=c11 -Wall -Werror "${xflags[@]}" examples/simple.c $(pkg-config --cflags lamina) ${slibs/-llamina/-l:liblamina.a} \
    -o "$T/simple_static" 2>"$T/err"; then
    ok pkgconfig_static_builds
    ! ldd "$T/simple_static" | grep -q liblamina && ok static_needs_no_so || bad static_needs_no_so "$(ldd "$T/simple_static")"
    got=$("$T/simple_static" "$M" "Once upon a time" 30 2>"$T/err")
    [ -n "$want" ] && [ "$got" == "$want" ] && ok pkgconfig_static_output || bad pkgconfig_static_output "$got" "$(cat "$T/err")"
else
    bad pkgconfig_static_builds "$(cat "$T/err")"
fi
# PREFIX alone (no DESTDIR): the .pc names that prefix
if make -s install "${keep[@]}" BUILD="$BUILD" PREFIX="$T/prefix" >"$T/install.log" 2>&1 &&
    grep -q "^prefix=$T/prefix\$" "$T/prefix/lib/pkgconfig/lamina.pc"; then
    unset PKG_CONFIG_SYSROOT_DIR
    PKG_CONFIG_PATH=$T/prefix/lib/pkgconfig PKG_CONFIG_LIBDIR=$T/prefix/lib/pkgconfig pkg-config --cflags lamina | grep -q -- "-I$T/prefix/include" \
        && ok install_prefix || bad install_prefix "$(cat "$T/prefix/lib/pkgconfig/lamina.pc")"
else
    bad install_prefix "$(tail -20 "$T/install.log")"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
