#!/usr/bin/env bash
# Claim: what `cmake --install` puts in a prefix is enough to build a user's
# program, through pkg-config and through find_package(plexus), and the
# program runs.  If it failed, the README's "Using the library" would not
# work for a new user.  And the installed zoo (plexus/zoo.h): examples/zoo_cnn.c
# compiled with only the prefix's headers and library (cc -I prefix/include
# -L prefix/lib -lplexus, no source tree) builds the CNN and trains it.
set -euo pipefail
build=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
export PKG_CONFIG_PATH=$work/prefix/lib/pkgconfig
cc -std=c11 "$src/examples/quickstart.c" -o "$work/qs_pkgconfig" $(pkg-config --cflags --libs --static plexus)
mkdir -p "$work/user"
cat > "$work/user/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.18)
project(user C)
find_package(plexus REQUIRED)
add_executable(qs $src/examples/quickstart.c)
target_link_libraries(qs PRIVATE plexus::plexus_shared)
CMAKE
cmake -S "$work/user" -B "$work/user/build" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/user/build" >/dev/null
# Only the installed headers: a copy of the example outside the source tree.
cp "$src/examples/zoo_cnn.c" "$work/zoo_cnn.c"
test -f "$work/prefix/include/plexus/zoo.h"
cc -std=c11 -I"$work/prefix/include" "$work/zoo_cnn.c" -o "$work/zoo_cnn" -L"$work/prefix/lib" -lplexus \
  -Wl,-rpath,"$work/prefix/lib" -lm
"$work/zoo_cnn"
"$work/qs_pkgconfig" | tail -n 2
"$work/user/build/qs" --threads 2 | tail -n 2
echo "install_then_build_user_program: ok"
