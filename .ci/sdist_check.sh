#!/usr/bin/env bash
# The sdist runs its own tests: build it, unpack it into a temporary folder, and collect its
# tests there (against the sdist's own src/) — the same test ids as the checkout's, or fail.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
py=${PYTHON:-$root/.venv/bin/python}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if "$py" -m build --version >/dev/null 2>&1; then  # pypa/build, where installed
  build=("$py" -m build --sdist --no-isolation --outdir "$tmp/dist" .)
else
  build=("$py" -c "import sys; from setuptools import build_meta; build_meta.build_sdist(sys.argv[1])"
    "$tmp/dist")
fi
"${build[@]}" > "$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; echo "the sdist did not build"; exit 1; }
sdist=$(ls "$tmp"/dist/posenc-*.tar.gz)
echo "sdist: $(basename "$sdist") ($(du -k "$sdist" | cut -f1) KiB)"
mkdir "$tmp/src"
tar -xzf "$sdist" -C "$tmp/src"
unpacked=$(ls -d "$tmp"/src/posenc-*)

# --assert=plain: collecting runs no assert, and rewriting the test modules' asserts is a third of
# a collection where PYTHONDONTWRITEBYTECODE keeps pytest from caching the rewrite (this check on
# 2 cores: 25 s -> 19 s wall, 47 -> 36 s of CPU).
collect() {  # collect-only test ids of the project in $1, importing posenc from $1/src
  (cd "$1" && PYTHONPATH="$1/src${PYTHONPATH:+:$PYTHONPATH}" "$py" -m pytest --collect-only -q \
    --assert=plain -p no:cacheprovider -p no:xdist 2>&1) > "$2" || { tail -40 "$2"; echo "collection failed in $1"; exit 1; }
  grep '::' "$2" | sort > "$2.ids"
}
# The two collections side by side (each is mostly one process importing torch and the tests).
collect "$root" "$tmp/checkout.txt" &
checkout=$!
collect "$unpacked" "$tmp/sdist.txt" &
sdist_pid=$!
wait "$checkout"
wait "$sdist_pid"
# The sdist's collection imports the sdist's posenc (PYTHONPATH ahead of an editable install).
(cd "$unpacked" && PYTHONPATH="$unpacked/src" "$py" -c \
  "import posenc, sys; sys.exit(not posenc.__file__.startswith(sys.argv[1]))" "$unpacked/src") \
  || { echo "the sdist's tests did not import the sdist's posenc"; exit 1; }

n_checkout=$(wc -l < "$tmp/checkout.txt.ids")
n_sdist=$(wc -l < "$tmp/sdist.txt.ids")
echo "collected: checkout $n_checkout, sdist $n_sdist"
if [ "$n_checkout" != "$n_sdist" ] || ! cmp -s "$tmp/checkout.txt.ids" "$tmp/sdist.txt.ids"; then
  echo "the sdist's tests differ from the checkout's:"
  diff "$tmp/checkout.txt.ids" "$tmp/sdist.txt.ids" | head -40 || true
  exit 1
fi
echo "sdist check: ok"
