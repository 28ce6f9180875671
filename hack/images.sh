#!/usr/bin/env bash
# Build crisp's hermetic test images from the host's /bin/busybox (busybox-static),
# with no registry:
#
#   hack/images.sh OUTDIR
#
# writes three OCI image-layout archives for `ctr images import`:
#   OUTDIR/busybox.tar   crisp.test/busybox:latest
#   OUTDIR/pause.tar     crisp.test/pause:latest
#   OUTDIR/images.tar    both (hack/containerd.sh imports this one: one call)
#
# Each manifest in index.json carries the annotation
# io.containerd.image.name=crisp.test/NAME:latest, which containerd 1.6's importer
# uses as the image name, so a plain
#   ctr -n k8s.io images import OUTDIR/images.tar
# creates both images under their names. (The ref.name annotation is "latest", so
# `--base-name crisp.test/busybox` on busybox.tar gives the same name.)
#
# Both images share one rootfs layer: /bin/busybox, a relative symlink for every
# applet at its canonical path (/bin/sh, /usr/bin/env, /sbin/...), /etc/passwd
# and /etc/group with root (and nobody), /tmp (1777), /root.
#   busybox: default cmd ["sh"], PATH set.
#   pause:   entrypoint is a busybox sh loop that sleeps forever and exits 0 on
#            SIGTERM/SIGINT.
#
# Cache: when OUTDIR already holds the three archives and they are newer than
# /bin/busybox and this script, nothing is done. Concurrent runs on one OUTDIR
# are serialised with flock, and archives are renamed into place atomically.
set -euo pipefail

BUSYBOX=/bin/busybox
SELF="$(readlink -f "${BASH_SOURCE[0]}")"

die() {
  echo "hack/images.sh: error: $*" >&2
  exit 1
}

[[ $# -eq 1 ]] || die "usage: $0 OUTDIR"
OUTDIR="$1"

[[ -x "$BUSYBOX" ]] || die "$BUSYBOX not found: install busybox-static (hack/setup.sh)"
command -v umoci >/dev/null 2>&1 || die "umoci not found: run hack/setup.sh"
if ! "$BUSYBOX" --list >/dev/null 2>&1; then
  die "$BUSYBOX does not run as a multi-call busybox"
fi

mkdir -p "$OUTDIR"
OUTDIR="$(cd "$OUTDIR" && pwd -P)"

fresh() {
  local f
  for f in "$OUTDIR/busybox.tar" "$OUTDIR/pause.tar" "$OUTDIR/images.tar"; do
    [[ -s "$f" && "$f" -nt "$BUSYBOX" && "$f" -nt "$SELF" ]] || return 1
  done
}

fresh && exit 0

exec 9>"$OUTDIR/.lock"
flock 9
# Another run may have built them while we waited for the lock.
fresh && exit 0

WORK="$(mktemp -d "$OUTDIR/.build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# --- rootfs -----------------------------------------------------------------

populate_rootfs() {
  local root="$1" applet dir up
  mkdir -p "$root/bin" "$root/sbin" "$root/usr/bin" "$root/usr/sbin" \
    "$root/etc" "$root/root" "$root/tmp" "$root/var" "$root/proc" "$root/sys" "$root/dev"
  chmod 1777 "$root/tmp"
  chmod 0700 "$root/root"
  install -m 0755 "$BUSYBOX" "$root/bin/busybox"
  while IFS= read -r applet; do
    case "$applet" in
      */*) ;;          # skip top-level entries such as "linuxrc"
      *) continue ;;
    esac
    [[ "$applet" == bin/busybox ]] && continue
    [[ -e "$root/$applet" || -L "$root/$applet" ]] && continue
    dir="${applet%/*}"
    # relative link back to /bin/busybox: one "../" per directory level
    up="${dir//[^\/]/}"
    up="${up//\//../}../"
    mkdir -p "$root/$dir"
    ln -s "${up}bin/busybox" "$root/$applet"
  done < <("$BUSYBOX" --list-full)
  [[ -L "$root/bin/sh" ]] || die "busybox has no sh applet"
  cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
  cat >"$root/etc/group" <<'EOF'
root:x:0:
nogroup:x:65534:
EOF
  chmod 0644 "$root/etc/passwd" "$root/etc/group"
}

# --- images -------------------------------------------------------------------

ARCH="$(dpkg --print-architecture 2>/dev/null || echo amd64)"
ENV_PATH="PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# pause: PID 1 of the sandbox. A trap makes sh handle TERM/INT (PID 1 ignores
# signals it has no handler for); `wait` returns as soon as a trapped signal arrives.
PAUSE_SCRIPT='trap "exit 0" TERM INT; while :; do sleep 86400 & wait $!; done'

# Reproducible: every timestamp (file mtimes, layer history, image "created") is
# the mtime of /bin/busybox, so the same busybox always yields the same image ids.
EPOCH="$(stat -c %Y "$BUSYBOX")"
CREATED="$(date -u -d "@$EPOCH" +%Y-%m-%dT%H:%M:%SZ)"

# One base layout with the rootfs layer; both images are configs on top of that
# same layer, so importing the second image unpacks nothing new.
base="$WORK/base"
umoci init --layout "$base"
umoci new --image "$base:latest"
umoci unpack --image "$base:latest" "$WORK/bundle" >/dev/null
populate_rootfs "$WORK/bundle/rootfs"
find "$WORK/bundle/rootfs" -exec touch -h -d "@$EPOCH" {} +
umoci repack --image "$base:latest" \
  --history.created "$CREATED" --history.created_by "hack/images.sh: busybox-static rootfs" \
  "$WORK/bundle" >/dev/null

# manifest_entry LAYOUT FULLNAME: index.json entry of LAYOUT's single manifest,
# annotated with the full image name. containerd's importer names an image after
# "io.containerd.image.name" when present (no --base-name needed) and otherwise
# after --base-name + ":" + "org.opencontainers.image.ref.name".
manifest_entry() {
  local layout="$1" fullname="$2" index digest size
  index="$(cat "$layout/index.json")"
  digest="$(sed -n 's/.*"digest":"\(sha256:[0-9a-f]\{64\}\)".*/\1/p' <<<"$index")"
  size="$(sed -n 's/.*"size":\([0-9]*\).*/\1/p' <<<"$index")"
  [[ -n "$digest" && -n "$size" ]] || die "cannot parse $layout/index.json: $index"
  printf '{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"latest"}}' \
    "$digest" "$size" "$fullname"
}

# write_index LAYOUT ENTRY...
write_index() {
  local layout="$1" IFS=,
  shift
  printf '{"schemaVersion":2,"manifests":[%s]}' "$*" >"$layout/index.json"
}

# pack LAYOUT OUT.tar: an OCI image-layout tar (oci-layout, index.json, blobs/ at
# the top level), renamed into place atomically.
pack() {
  local layout="$1" out="$2" tmp
  tmp="$WORK/$(basename "$out")"
  tar -C "$layout" --sort=name --mtime="@$EPOCH" --owner=0 --group=0 --numeric-owner \
    -cf "$tmp" oci-layout index.json blobs
  mv -f "$tmp" "$out"
}

# image NAME [umoci config args...]: layout $WORK/NAME with one manifest,
# crisp.test/NAME:latest.
image() {
  local name="$1"
  shift
  local layout="$WORK/$name"
  cp -a "$base" "$layout"
  umoci config --image "$layout:latest" \
    --os linux --architecture "$ARCH" --created "$CREATED" \
    --config.env "$ENV_PATH" --config.workingdir / \
    --history.created "$CREATED" --history.created_by "hack/images.sh: $name config" \
    "$@"
  umoci gc --layout "$layout"
  ENTRY["$name"]="$(manifest_entry "$layout" "crisp.test/$name:latest")"
  write_index "$layout" "${ENTRY[$name]}"
}

declare -A ENTRY=()
image busybox --config.cmd sh
image pause --config.entrypoint /bin/sh --config.entrypoint -c --config.entrypoint "$PAUSE_SCRIPT"

# Both images in one archive: one `ctr images import` instead of two.
cp -a "$WORK/busybox" "$WORK/all"
cp -an "$WORK/pause/blobs/sha256/." "$WORK/all/blobs/sha256/"
write_index "$WORK/all" "${ENTRY[busybox]}" "${ENTRY[pause]}"

pack "$WORK/busybox" "$OUTDIR/busybox.tar"
pack "$WORK/pause" "$OUTDIR/pause.tar"
pack "$WORK/all" "$OUTDIR/images.tar"
echo "hack/images.sh: built $OUTDIR/busybox.tar $OUTDIR/pause.tar $OUTDIR/images.tar"
