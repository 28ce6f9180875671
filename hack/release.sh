#!/usr/bin/env bash
# Builds crisp's release artifacts into dist/ with one command, offline (no registry):
#
#   hack/release.sh [--out DIR] [--binary FILE]
#
#   dist/crisp-VERSION-linux-amd64               static x86_64 binary: no libc, Rust or protoc
#                                                needed on the node (glibc linked in statically)
#   dist/crisp_VERSION_amd64.deb                 /usr/bin/crisp, crisp.socket + crisp.service
#                                                (enabled, started), /etc/crisp/config.toml,
#                                                crisp-install / crisp-uninstall; the postinst
#                                                never touches kubelet unless asked
#                                                (CRISP_REWIRE_KUBELET=1)
#   dist/crisp-installer-VERSION.oci.tar         OCI image-layout archive of the DaemonSet's
#                                                installer (busybox + the binary +
#                                                hack/install.sh), named
#                                                crisp-installer:VERSION for `ctr images import`
#   dist/crisp-installer-VERSION.digest          that image's manifest digest (sha256:...)
#   dist/deploy/                                 the DaemonSet (kustomize base and uninstall
#                                                overlay) with the installer image pinned:
#                                                crisp-installer:VERSION@sha256:DIGEST
#   dist/SHA256SUMS                              sha256sum -c format
#
# Reproducible: every timestamp is SOURCE_DATE_EPOCH (default: the last commit's time), paths
# of the build machine are remapped out of the binary, and it is built with one codegen unit,
# so the same commit and toolchain give byte-identical artifacts (tests/it/release_artifacts.rs
# builds twice and compares).
#
# --binary FILE packages an already-built static binary instead of building one (tests).
# Needs: cargo (the x86_64-unknown-linux-gnu target's static glibc: libc6-dev), dpkg-deb, umoci
# and busybox-static (hack/setup.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"

OUT="$REPO/dist"
BINARY=""
die() {
  echo "hack/release.sh: error: $*" >&2
  exit 1
}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) OUT="${2:?--out needs a directory}"; shift 2 ;;
    --binary) BINARY="${2:?--binary needs a file}"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1'" ;;
  esac
done

TARGET=x86_64-unknown-linux-gnu
VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)"
[[ -n "$VERSION" ]] || die "no version in Cargo.toml"
if [[ -z "${SOURCE_DATE_EPOCH:-}" ]]; then
  SOURCE_DATE_EPOCH="$(git log -1 --format=%ct 2>/dev/null || echo 0)"
fi
export SOURCE_DATE_EPOCH
CREATED="$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)"
for tool in dpkg-deb umoci; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool not found: run hack/setup.sh"
done
[[ -x /bin/busybox ]] || die "/bin/busybox missing: install busybox-static (hack/setup.sh)"

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd -P)"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/crisp-release.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# Every file of a tree gets the same mtime, and no group/other write bits from a umask.
normalize() { # dir
  find "$1" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
}

# ---- static binary --------------------------------------------------------------------------------

if [[ -z "$BINARY" ]]; then
  echo "hack/release.sh: building the static binary (cargo --profile dist --target $TARGET)"
  # +crt-static links glibc statically (no musl target is installable here). Remapping the
  # checkout, the target directory (build scripts' generated code lives there) and cargo's home
  # keeps the build machine's paths out of the binary, so a checkout elsewhere builds the same
  # bytes. The last matching remap wins.
  target_dir="${CARGO_TARGET_DIR:-$REPO/target}"
  RUSTFLAGS="-C target-feature=+crt-static --remap-path-prefix=$REPO=/crisp --remap-path-prefix=${CARGO_HOME:-$HOME/.cargo}=/cargo --remap-path-prefix=$target_dir=/target" \
    cargo build --locked --profile dist --target "$TARGET" --bin crisp
  BINARY="$target_dir/$TARGET/dist/crisp"
fi
[[ -x "$BINARY" ]] || die "$BINARY is not an executable file"
if ldd "$BINARY" >/dev/null 2>&1 && ! ldd "$BINARY" 2>&1 | grep -q 'statically linked'; then
  die "$BINARY is dynamically linked: $(ldd "$BINARY" | tr '\n' ' ')"
fi
BIN_OUT="$OUT/crisp-$VERSION-linux-amd64"
install -m 0755 "$BINARY" "$BIN_OUT"
touch -d "@$SOURCE_DATE_EPOCH" "$BIN_OUT"

# ---- .deb -----------------------------------------------------------------------------------------

pkg="$WORK/deb"
install -D -m 0755 "$BINARY" "$pkg/usr/bin/crisp"
for u in crisp.service crisp.socket; do
  install -D -m 0644 "systemd/$u" "$pkg/lib/systemd/system/$u"
done
# The package's binary is /usr/bin/crisp (hack/install.sh's is /usr/local/bin/crisp).
sed -i 's|^ExecStart=/usr/local/bin/crisp$|ExecStart=/usr/bin/crisp|' "$pkg/lib/systemd/system/crisp.service"
grep -qx 'ExecStart=/usr/bin/crisp' "$pkg/lib/systemd/system/crisp.service" || die "systemd/crisp.service: ExecStart not rewritten"
install -D -m 0644 packaging/deb/config.toml "$pkg/etc/crisp/config.toml"
install -D -m 0755 hack/install.sh "$pkg/usr/share/crisp/hack/install.sh"
install -D -m 0755 hack/uninstall.sh "$pkg/usr/share/crisp/hack/uninstall.sh"
install -D -m 0644 systemd/kubelet.service.d/90-crisp.conf "$pkg/usr/share/crisp/systemd/kubelet.service.d/90-crisp.conf"
install -D -m 0755 packaging/deb/crisp-install "$pkg/usr/sbin/crisp-install"
install -D -m 0755 packaging/deb/crisp-uninstall "$pkg/usr/sbin/crisp-uninstall"
install -D -m 0644 README.md "$pkg/usr/share/doc/crisp/README.md"
# The README links into docs/: ship every page there beside it, at the same relative paths.
for page in docs/*.md; do
  install -D -m 0644 "$page" "$pkg/usr/share/doc/crisp/$page"
done
install -D -m 0644 docs/INSTALL.md "$pkg/usr/share/doc/crisp/INSTALL.md"
printf 'Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\nUpstream-Name: crisp\n\nFiles: *\nCopyright: the crisp developers\nLicense: Apache-2.0\n On Debian systems the full text is in /usr/share/common-licenses/Apache-2.0.\n' \
  >"$pkg/usr/share/doc/crisp/copyright"
mkdir -p "$pkg/DEBIAN"
install -m 0755 packaging/deb/postinst packaging/deb/prerm packaging/deb/postrm "$pkg/DEBIAN/"
echo /etc/crisp/config.toml >"$pkg/DEBIAN/conffiles"
size="$(du -sk --exclude=DEBIAN "$pkg" | cut -f1)"
sed -e "s/@VERSION@/$VERSION/" -e "s/@SIZE@/$size/" packaging/deb/control >"$pkg/DEBIAN/control"
(cd "$pkg" && find . -path ./DEBIAN -prune -o -type f -print | LC_ALL=C sort | sed 's|^\./||' | xargs md5sum >DEBIAN/md5sums)
chmod 0644 "$pkg/DEBIAN/control" "$pkg/DEBIAN/conffiles" "$pkg/DEBIAN/md5sums"
find "$pkg" -type d -exec chmod 0755 {} +
normalize "$pkg"
DEB_OUT="$OUT/crisp_${VERSION}_amd64.deb"
# dpkg-deb sorts members and clamps their mtimes to SOURCE_DATE_EPOCH.
dpkg-deb --root-owner-group -Zxz --build "$pkg" "$DEB_OUT" >/dev/null

# ---- installer image ------------------------------------------------------------------------------

layout="$WORK/oci"
umoci init --layout "$layout"
umoci new --image "$layout:$VERSION"
umoci unpack --image "$layout:$VERSION" "$WORK/bundle" >/dev/null
rootfs="$WORK/bundle/rootfs"
mkdir -p "$rootfs"/{bin,sbin,usr/bin,usr/sbin,etc,tmp,proc,sys,dev,host,opt/crisp/hack,opt/crisp/systemd/kubelet.service.d}
chmod 1777 "$rootfs/tmp"
install -m 0755 /bin/busybox "$rootfs/bin/busybox"
# Only the applets the entrypoint and its probe use, as links to /bin/busybox.
for applet in sh cat cp date echo hostname mkdir nsenter readlink rm sleep chmod; do
  ln -s busybox "$rootfs/bin/$applet"
done
printf 'root:x:0:0:root:/:/bin/sh\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\n' >"$rootfs/etc/group"
install -m 0755 "$BINARY" "$rootfs/opt/crisp/crisp"
install -m 0755 hack/install.sh hack/uninstall.sh "$rootfs/opt/crisp/hack/"
install -m 0644 systemd/crisp.service systemd/crisp.socket "$rootfs/opt/crisp/systemd/"
install -m 0644 systemd/kubelet.service.d/90-crisp.conf "$rootfs/opt/crisp/systemd/kubelet.service.d/"
install -m 0755 deploy/installer/entrypoint.sh "$rootfs/opt/crisp/entrypoint.sh"
normalize "$rootfs"
umoci repack --image "$layout:$VERSION" \
  --history.created "$CREATED" --history.created_by "hack/release.sh: crisp-installer $VERSION" \
  "$WORK/bundle" >/dev/null
umoci config --image "$layout:$VERSION" \
  --os linux --architecture amd64 --created "$CREATED" \
  --config.env "PATH=/bin:/usr/bin:/sbin:/usr/sbin" --config.workingdir / \
  --config.entrypoint /opt/crisp/entrypoint.sh \
  --config.label "org.opencontainers.image.version=$VERSION" \
  --config.label "org.opencontainers.image.title=crisp-installer" \
  --history.created "$CREATED" --history.created_by "hack/release.sh: crisp-installer config"
umoci gc --layout "$layout"
# index.json names the image for containerd's importer (io.containerd.image.name) and for
# OCI tools (ref.name), as hack/images.sh does.
index="$(cat "$layout/index.json")"
digest="$(sed -n 's/.*"digest":"\(sha256:[0-9a-f]\{64\}\)".*/\1/p' <<<"$index")"
msize="$(sed -n 's/.*"size":\([0-9]*\).*/\1/p' <<<"$index")"
[[ -n "$digest" && -n "$msize" ]] || die "cannot parse $layout/index.json: $index"
printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"%s","size":%s,"annotations":{"io.containerd.image.name":"crisp-installer:%s","org.opencontainers.image.ref.name":"%s"}}]}' \
  "$digest" "$msize" "$VERSION" "$VERSION" >"$layout/index.json"
IMG_OUT="$OUT/crisp-installer-$VERSION.oci.tar"
tar -C "$layout" --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
  -cf "$IMG_OUT" oci-layout index.json blobs
touch -d "@$SOURCE_DATE_EPOCH" "$DEB_OUT" "$IMG_OUT"

# ---- the pinned overlay --------------------------------------------------------------------------

# deploy/ as released: the kustomize base and the uninstall overlay with every reference to the
# installer image pinned to the digest just built (apply this, not the source tree's tag).
DEPLOY_OUT="$OUT/deploy"
IMAGE_REF="crisp-installer:$VERSION@$digest"
rm -rf "$DEPLOY_OUT"
mkdir -p "$DEPLOY_OUT"
cp -r deploy/base deploy/uninstall "$DEPLOY_OUT/"
sed -i "s|^\( *image:\) crisp-installer:[^@[:space:]]*\$|\1 $IMAGE_REF|" "$DEPLOY_OUT/base/crisp-installer.yaml"
pins="$(grep -c "^ *image: $IMAGE_REF\$" "$DEPLOY_OUT/base/crisp-installer.yaml" || true)"
images="$(grep -c '^ *image:' "$DEPLOY_OUT/base/crisp-installer.yaml" || true)"
[[ "$pins" -ge 1 && "$pins" == "$images" ]] || die "deploy/base/crisp-installer.yaml: $pins of $images images pinned to $IMAGE_REF"
printf '%s\n' "$digest" >"$OUT/crisp-installer-$VERSION.digest"
find "$DEPLOY_OUT" -type d -exec chmod 0755 {} +
find "$DEPLOY_OUT" -type f -exec chmod 0644 {} +
normalize "$DEPLOY_OUT"
touch -d "@$SOURCE_DATE_EPOCH" "$OUT/crisp-installer-$VERSION.digest"

# ---- sums -----------------------------------------------------------------------------------------

(cd "$OUT" && sha256sum "$(basename "$BIN_OUT")" "$(basename "$DEB_OUT")" "$(basename "$IMG_OUT")" >SHA256SUMS)
echo "hack/release.sh: crisp $VERSION in $OUT (installer image $IMAGE_REF):"
for f in "$BIN_OUT" "$DEB_OUT" "$IMG_OUT" "$OUT/SHA256SUMS"; do
  printf '  %s\t%s\n' "$(stat -c %s "$f")" "$(basename "$f")"
done
echo "  deploy/ (the DaemonSet pinned to $IMAGE_REF): push the image keeping its digest"
echo "    (skopeo copy --preserve-digests oci-archive:$IMG_OUT docker://REGISTRY/crisp-installer:$VERSION),"
echo "    name your registry in an overlay (images: [{name: crisp-installer, newName: REGISTRY/crisp-installer}]),"
echo "    then kubectl apply -k of it (docs/DEPLOY.md)"
