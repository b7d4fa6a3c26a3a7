#!/bin/sh
# Installs the build tree into a temporary prefix, then builds and runs a consumer through
# find_package(clffn) and through pkg-config. Arguments: the build directory, the source dir.
set -eu
build=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cmake -S "$src/tests/install/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/consumer" >/dev/null
LD_LIBRARY_PATH="$tmp/prefix/lib:$tmp/prefix/lib64:$(dirname "$(find "$tmp/prefix" -name 'libclffn.so*' | head -1)")" \
  "$tmp/consumer/consumer"
pcdir=$(dirname "$(find "$tmp/prefix" -name clffn.pc | head -1)")
cflags=$(PKG_CONFIG_PATH="$pcdir" pkg-config --cflags clffn)
libs=$(PKG_CONFIG_PATH="$pcdir" pkg-config --libs clffn)
# shellcheck disable=SC2086
cc -std=c11 ${CFLAGS:-} $cflags "$src/tests/install/consumer/main.c" $libs ${LDFLAGS:-} -o "$tmp/pc-consumer"
LD_LIBRARY_PATH="$(dirname "$(find "$tmp/prefix" -name 'libclffn.so*' | head -1)")" "$tmp/pc-consumer"
# the Python package, when installed (third argument: the interpreter), loads the library it was
# installed with: no CLFFN_LIBRARY, no library path
if [ -n "${3:-}" ]; then
  pkg=$(dirname "$(find "$tmp/prefix" -path '*/clffn/__init__.py' | head -1)")
  env -u CLFFN_LIBRARY PYTHONPATH="$(dirname "$pkg")" "$3" -c \
    "import clffn, numpy; d = clffn.devices(); assert d; print('python:', d[0]['name']); assert clffn.FFN(4, 8)(numpy.ones((2, 4), 'float32')).shape == (2, 4); clffn._lib.io()"
  echo "install: the Python package found its library"
fi
echo "install: find_package and pkg-config consumers ran"
