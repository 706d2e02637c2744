#!/usr/bin/env bash
# Builds busybox from Debian's busybox source package with upstream's default configuration
# (once; cached in target/busybox) and prints the binary's path. The source comes through
# apt from the machine's own Debian sources, read into a private apt state folder: the
# system's apt configuration is not changed.
source "$(dirname "$0")/lib.sh"
OUT="$ROOT/target/busybox"
if [ -x "$OUT/busybox" ]; then
  echo "$OUT/busybox"
  exit 0
fi
mkdir -p "$OUT"
apt_dir="$OUT/apt"
rm -rf "$apt_dir" && mkdir -p "$apt_dir/lists/partial" "$apt_dir/parts" "$apt_dir/src"
# The machine's sources, as source-package entries (deb822 and one-line formats).
for f in /etc/apt/sources.list.d/*.sources; do
  if [ -e "$f" ]; then sed 's/^Types: deb$/Types: deb-src/' "$f" > "$apt_dir/parts/$(basename "$f")"; fi
done
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
  if [ -e "$f" ]; then sed -n 's/^deb \(.*\)/deb-src \1/p' "$f" > "$apt_dir/parts/$(basename "$f")"; fi
done
apt_opts=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$apt_dir/parts"
          -o "Dir::State::Lists=$apt_dir/lists" -o APT::Sandbox::User=root)
log "fetching Debian's busybox source"
apt-get "${apt_opts[@]}" -qq update >&2
(cd "$apt_dir/src" && apt-get "${apt_opts[@]}" -qq source --download-only busybox >&2)
orig="$(ls "$apt_dir"/src/busybox_*.orig.tar.* | head -n 1)"
[ -n "$orig" ] || die "Debian's busybox source did not download"
build="$OUT/build"
rm -rf "$build" && mkdir -p "$build"
tar -xf "$orig" -C "$build" --strip-components=1
log "building busybox (upstream defconfig)"
make -C "$build" -s defconfig >/dev/null
make -C "$build" -s -j"$(nproc)" busybox >&2
cp "$build/busybox" "$OUT/busybox.tmp" && mv "$OUT/busybox.tmp" "$OUT/busybox"
rm -rf "$build" "$apt_dir"
echo "$OUT/busybox"
