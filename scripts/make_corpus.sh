#!/usr/bin/env bash
# Builds the offline surrogate-training corpus (see data/corpus/SOURCES.md):
#   scripts/make_corpus.sh [OUT_DIR]        (default: data/corpus-build)
# Downloads the Debian packages that hold the texts with `apt-get download` and unpacks them with
# `dpkg-deb -x` into OUT_DIR/_pkgs/root instead of installing them: r-cran-janeaustenr would otherwise
# pull in all of R, and nothing here needs to be installed system-wide. The KJV text is decoded by the
# unpacked `bible` program (needs libreadline8, present on any Debian with bash). The Python standard
# library comes from the local /usr/lib/python3.X (package libpython3.X-stdlib, installed if missing).
# Needs: apt-get (Debian bookworm or later), dpkg-deb, python3 (standard library only).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$(mkdir -p "${1:-$ROOT/data/corpus-build}" && cd "${1:-$ROOT/data/corpus-build}" && pwd)"
PKGS=(r-cran-janeaustenr bible-kjv bible-kjv-text jargon-text fortunes fortunes-min dict-devil)
PKG_DIR="$OUT/_pkgs"

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

if ! ls /usr/lib/python3.*/email/parser.py >/dev/null 2>&1; then
  echo "make_corpus: installing the Python standard library sources (libpython3-stdlib)"
  $SUDO apt-get install -y --no-install-recommends libpython3-stdlib
fi

mkdir -p "$PKG_DIR/debs"
rm -rf "$PKG_DIR/root"
cd "$PKG_DIR/debs"
rm -f ./*.deb
if ! apt-get -o APT::Sandbox::User=root download "${PKGS[@]}"; then
  echo "make_corpus: apt-get download failed; refreshing the package lists and retrying"
  $SUDO apt-get update
  apt-get -o APT::Sandbox::User=root download "${PKGS[@]}"
fi
: > "$PKG_DIR/versions.txt"
for deb in ./*.deb; do
  dpkg-deb -x "$deb" "$PKG_DIR/root"
  printf '%s %s %s\n' "$(dpkg-deb -f "$deb" Package)" "$(dpkg-deb -f "$deb" Version)" \
    "$(sha256sum "$deb" | cut -d' ' -f1)" >> "$PKG_DIR/versions.txt"
done
sort -o "$PKG_DIR/versions.txt" "$PKG_DIR/versions.txt"

python3 "$ROOT/scripts/make_corpus.py" --pkg-root "$PKG_DIR/root" --out "$OUT"
