#!/usr/bin/env bash
# Undo hack/install.sh: kubelet back on the runtime's socket, crisp removed.
#
#   sudo hack/uninstall.sh [--dry-run] [--force] [--no-restart] [--root DIR]
#
# Reads /var/lib/crisp/install/manifest (written by install.sh) and, for each entry:
#   modified FILE   restores the backup taken before crisp's first change, byte for byte
#                   (content, mode, owner, timestamps)
#   created FILE    removes the file
#   link LINK       removes the enablement symlink
#   dir DIR         removes the directory if it is empty
# then removes /var/lib/crisp/install. On a live node (--root /, systemd running) it then
# reloads systemd, restarts kubelet (now talking to the runtime directly) and only then stops
# crisp.service and crisp.socket. Running pods keep running.
#
# A file changed by someone else after install.sh wrote it (a kubeadm upgrade, an operator) is
# not silently rolled back: uninstall stops before changing anything and names it; --force
# restores/removes it anyway. Running it again when crisp is not installed does nothing.
# --dry-run prints what would change and changes nothing. --root DIR works on a node
# filesystem mounted at DIR and never restarts anything.
set -euo pipefail

PROG="hack/uninstall.sh"
STATE=/var/lib/crisp/install

ROOT=/
DRY_RUN=0
FORCE=0
RESTART=1

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
}

die() {
  echo "$PROG: error: $*" >&2
  exit 1
}

note() {
  echo "$PROG: $*"
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --root) ROOT="${2:?--root needs a directory}"; shift 2 ;;
    --root=*) ROOT="${1#*=}"; shift ;;
    --dry-run|-n) DRY_RUN=1; shift ;;
    --force|-f) FORCE=1; shift ;;
    --no-restart) RESTART=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

[[ -d "$ROOT" ]] || die "--root $ROOT is not a directory"
ROOT="$(cd "$ROOT" && pwd -P)"

r() { printf '%s%s' "${ROOT%/}" "$1"; }

MANIFEST="$(r "$STATE/manifest")"
if [[ ! -f "$MANIFEST" ]]; then
  note "crisp is not installed under $ROOT (no $MANIFEST): nothing to do"
  exit 0
fi
if [[ "$DRY_RUN" -eq 0 && "$(id -u)" -ne 0 ]]; then
  die "must run as root to change $ROOT (try: sudo $0 ...), or use --dry-run"
fi
LIVE=0
if [[ "$ROOT" == / && "$RESTART" -eq 1 && "$DRY_RUN" -eq 0 && -d /run/systemd/system ]] && command -v systemctl >/dev/null 2>&1; then
  LIVE=1
fi

mapfile -t ENTRIES <"$MANIFEST"
for e in "${ENTRIES[@]}"; do
  case "$e" in
    "modified /"*|"created /"*|"link /"*|"dir /"*) ;;
    *) die "$MANIFEST: unrecognised line '$e' (the manifest is written by hack/install.sh; do not edit it)" ;;
  esac
done

# Installed with --packaged (the .deb's crisp-install): the units are the package's, not ours.
OWN_UNITS=0
for e in "${ENTRIES[@]}"; do
  [[ "$e" == "created /etc/systemd/system/crisp.service" || "$e" == "modified /etc/systemd/system/crisp.service" ]] && OWN_UNITS=1
done

installed_hash() { # node-path -> recorded sha256 of what install.sh last wrote ("" if none)
  local h
  h="$(r "$STATE/installed$1.sha256")"
  if [[ -f "$h" ]]; then cat "$h"; fi
}
current_hash() { sha256sum <"$(r "$1")" | awk '{print $1}'; }

# ---- preflight: nothing is changed unless every entry can be undone -----------------------------

conflicts=()
for e in "${ENTRIES[@]}"; do
  kind="${e%% *}"
  p="${e#* }"
  case "$kind" in
    modified)
      [[ -f "$(r "$STATE/backup$p")" ]] || die "backup of $p is missing ($(r "$STATE/backup$p")); cannot restore it. Restore it by hand, then remove the line 'modified $p' from $MANIFEST"
      if [[ -f "$(r "$p")" && "$(current_hash "$p")" != "$(installed_hash "$p")" ]]; then
        conflicts+=("$p (restoring $STATE/backup$p would drop those changes)")
      fi ;;
    created)
      if [[ -f "$(r "$p")" && "$(current_hash "$p")" != "$(installed_hash "$p")" ]]; then
        conflicts+=("$p (removing it would drop those changes)")
      fi ;;
  esac
done
if [[ ${#conflicts[@]} -gt 0 ]]; then
  if [[ "$FORCE" -eq 0 ]]; then
    printf '%s: changed since hack/install.sh wrote it: %s\n' "$PROG" "${conflicts[@]}" >&2
    die "nothing was changed. Compare them with the backups under $(r "$STATE/backup")/ and merge what must stay, then re-run with --force to restore/remove them anyway"
  fi
  printf '%s: --force: overriding later changes to %s\n' "$PROG" "${conflicts[@]}"
fi

# ---- dry run ------------------------------------------------------------------------------------

if [[ "$DRY_RUN" -eq 1 ]]; then
  note "dry run: nothing is changed (root $ROOT)"
  for ((i = ${#ENTRIES[@]} - 1; i >= 0; i--)); do
    e="${ENTRIES[i]}"
    kind="${e%% *}"
    p="${e#* }"
    case "$kind" in
      modified)
        if [[ -f "$(r "$p")" ]] && cmp -s "$(r "$p")" "$(r "$STATE/backup$p")"; then
          echo "would restore $p (content unchanged; mode/owner/times from the backup)"
        elif [[ "$p" == /usr/local/bin/* ]]; then
          echo "would restore $p from $STATE/backup$p"
        else
          echo "would restore $p from $STATE/backup$p:"
          diff -u --label "$p" --label "$p (restored)" "$(r "$p")" "$(r "$STATE/backup$p")" 2>/dev/null | sed 's/^/    /' || true
        fi ;;
      created) echo "would remove $p" ;;
      link) echo "would remove symlink $p" ;;
      dir) echo "would remove directory $p if empty" ;;
    esac
  done
  echo "would remove $STATE"
  if [[ "$ROOT" != / ]]; then
    note "would not start or restart anything (--root is not /)"
  else
    note "would restart kubelet.service, then stop crisp.service and crisp.socket"
  fi
  exit 0
fi

# ---- undo ---------------------------------------------------------------------------------------

restore() { # node-path: the backup back in place, atomically, attributes included
  local dst src tmp
  dst="$(r "$1")"
  src="$(r "$STATE/backup$1")"
  mkdir -p "$(dirname "$dst")"
  tmp="$(mktemp "$(dirname "$dst")/.crisp-uninstall.XXXXXX")"
  cp -p "$src" "$tmp"
  mv -f "$tmp" "$dst"
  note "restored $1"
}

# Files and links first (reverse order of installation), directories last, deepest first.
dirs=()
for ((i = ${#ENTRIES[@]} - 1; i >= 0; i--)); do
  e="${ENTRIES[i]}"
  kind="${e%% *}"
  p="${e#* }"
  case "$kind" in
    modified) restore "$p" ;;
    created)
      if [[ -e "$(r "$p")" || -L "$(r "$p")" ]]; then rm -f "$(r "$p")"; note "removed $p"; fi ;;
    link)
      if [[ -L "$(r "$p")" ]]; then rm -f "$(r "$p")"; note "removed $p"; fi ;;
    dir) dirs+=("$p") ;;
  esac
done
rm -rf "$(r "$STATE")"
note "removed $STATE"
# crisp's own state directory (job-mode records, held calls' intents) goes with the install when
# it holds no record: crisp creates its terminated/ and intents/ subdirectories at start, empty,
# and keeps its watchdog's restart counter in `watchdog` (derived, no promise to anyone).
for d in "${dirs[@]}"; do
  if [[ "$d" == /var/lib/crisp ]]; then
    rmdir "$(r /var/lib/crisp/terminated)" "$(r /var/lib/crisp/intents)" 2>/dev/null || true
    rm -f "$(r /var/lib/crisp/watchdog)"
  fi
done
for d in "${dirs[@]}"; do
  if [[ -d "$(r "$d")" ]]; then
    if rmdir "$(r "$d")" 2>/dev/null; then
      note "removed directory $d"
    else
      note "kept $d: not empty"
    fi
  fi
done

if [[ "$LIVE" -eq 1 ]]; then
  note "systemctl daemon-reload"
  systemctl daemon-reload
  note "systemctl restart kubelet.service"
  systemctl restart kubelet.service || note "warning: kubelet did not restart cleanly: journalctl -u kubelet"
  if [[ "$OWN_UNITS" -eq 1 ]]; then
    note "systemctl stop crisp.service crisp.socket"
    systemctl stop crisp.service crisp.socket || true
    systemctl reset-failed crisp.service crisp.socket 2>/dev/null || true
  else
    note "crisp.service and crisp.socket belong to the crisp package: left running (dpkg -r crisp removes them)"
  fi
  note "done: kubelet talks to the runtime directly"
elif [[ "$ROOT" != / ]]; then
  note "not starting or restarting anything: --root is not /"
else
  note "not restarting anything (--no-restart, or systemd is not running); to finish:"
  note "  systemctl daemon-reload && systemctl restart kubelet && systemctl stop crisp.service crisp.socket"
fi
