#!/usr/bin/env bash
# Install crisp on a kubeadm-style node and point kubelet at it.
#
#   sudo hack/install.sh [--binary FILE] [--config FILE] [--dry-run] [--no-restart]
#                        [--kubelet-version VERSION] [--kubelet-config FILE] [--root DIR]
#                        [--packaged]
#
# What it does (every step is skipped when already done, so running it twice changes nothing):
#   1. installs  /usr/local/bin/crisp                 (--binary, default target/release/crisp)
#                /etc/crisp/config.toml               (only if absent: --config FILE, or generated
#                                                      with upstream = kubelet's current endpoint)
#                /etc/systemd/system/crisp.service, crisp.socket (from systemd/), enabled
#                /etc/systemd/system/kubelet.service.d/90-crisp.conf (kubelet after crisp)
#   2. on a live node (--root /, systemd running, no --no-restart): starts crisp.socket and
#      crisp.service and waits until crisp is serving; stops here, kubelet untouched, if not.
#   3. points kubelet's runtime (and image) endpoint at unix:///run/crisp/crisp.sock in every
#      place the node sets it:
#        /var/lib/kubelet/kubeadm-flags.env   KUBELET_KUBEADM_ARGS  (kubeadm)
#        /etc/default/kubelet                 KUBELET_EXTRA_ARGS    (deb packages)
#        /etc/sysconfig/kubelet               KUBELET_EXTRA_ARGS    (rpm packages)
#        /var/lib/kubelet/config.yaml         containerRuntimeEndpoint / imageServiceEndpoint
#      and, for kubelet 1.27+ (`kubelet --version`, or --kubelet-version), removes
#      --container-runtime=remote, which those kubelets reject. If none of them sets an
#      endpoint, one is added (config file for 1.27+, else a flag).
#   4. restarts kubelet (live node only). Running pods keep running: crisp never rewrites ids.
#
# Every file it changes is backed up first under /var/lib/crisp/install/backup/ (the original,
# byte for byte, never overwritten by a later run); /var/lib/crisp/install/manifest lists what
# was changed and created. hack/uninstall.sh puts everything back exactly.
#
# --packaged: crisp's binary (/usr/bin/crisp), units (/lib/systemd/system) and config come from
# the crisp .deb and stay the package's: only kubelet is pointed at crisp (drop-in, kubelet's
# files, restart), after the same checks. The package's crisp-install runs this.
#
# --root DIR works on a node filesystem mounted at DIR (tests, images): all paths above are
# taken under DIR and nothing is ever started or restarted. --dry-run prints what would change
# (diffs of edited files) and changes nothing.
set -euo pipefail

PROG="hack/install.sh"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"

CRISP_SOCK=/run/crisp/crisp.sock
CRISP_ENDPOINT="unix://$CRISP_SOCK"
DEFAULT_UPSTREAM=/run/containerd/containerd.sock
BIN_DST=/usr/local/bin/crisp
CONFIG_DST=/etc/crisp/config.toml
UNIT_DIR=/etc/systemd/system
DROPIN_DST=$UNIT_DIR/kubelet.service.d/90-crisp.conf
STATE=/var/lib/crisp/install
KUBEADM_FLAGS=/var/lib/kubelet/kubeadm-flags.env
EXTRA_ARGS_FILES=(/etc/default/kubelet /etc/sysconfig/kubelet)

ROOT=/
DRY_RUN=0
RESTART=1
BINARY=""
CONFIG_SRC=""
KUBELET_VERSION=""
KUBELET_CONFIG=/var/lib/kubelet/config.yaml
PACKAGED=0
PKG_BIN=/usr/bin/crisp
PKG_UNIT_DIR=/lib/systemd/system

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
    --binary) BINARY="${2:?--binary needs a file}"; shift 2 ;;
    --binary=*) BINARY="${1#*=}"; shift ;;
    --config) CONFIG_SRC="${2:?--config needs a file}"; shift 2 ;;
    --config=*) CONFIG_SRC="${1#*=}"; shift ;;
    --kubelet-version) KUBELET_VERSION="${2:?--kubelet-version needs a version}"; shift 2 ;;
    --kubelet-version=*) KUBELET_VERSION="${1#*=}"; shift ;;
    --kubelet-config) KUBELET_CONFIG="${2:?--kubelet-config needs a file}"; shift 2 ;;
    --kubelet-config=*) KUBELET_CONFIG="${1#*=}"; shift ;;
    --dry-run|-n) DRY_RUN=1; shift ;;
    --no-restart) RESTART=0; shift ;;
    --packaged) PACKAGED=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

[[ -d "$ROOT" ]] || die "--root $ROOT is not a directory"
ROOT="$(cd "$ROOT" && pwd -P)"
[[ "$KUBELET_CONFIG" == /* ]] || die "--kubelet-config must be an absolute node path, got '$KUBELET_CONFIG'"

# Node path -> path on this machine.
r() { printf '%s%s' "${ROOT%/}" "$1"; }

LIVE=0
if [[ "$ROOT" == / && "$RESTART" -eq 1 && "$DRY_RUN" -eq 0 && -d /run/systemd/system ]] && command -v systemctl >/dev/null 2>&1; then
  LIVE=1
fi
if [[ "$DRY_RUN" -eq 0 && "$(id -u)" -ne 0 ]]; then
  die "must run as root to change $ROOT (try: sudo $0 ...), or use --dry-run"
fi

# ---- sources ----------------------------------------------------------------------------------

if [[ "$PACKAGED" -eq 1 ]]; then
  [[ -z "$BINARY" ]] || die "--packaged uses the package's $PKG_BIN; --binary is for unpackaged installs"
  for f in "$PKG_BIN" "$PKG_UNIT_DIR/crisp.service" "$PKG_UNIT_DIR/crisp.socket"; do
    [[ -e "$(r "$f")" ]] || die "--packaged: $(r "$f") missing: is the crisp package installed?"
  done
  BINARY="$(r "$PKG_BIN")"
  BIN_DST="$PKG_BIN"
fi
if [[ -z "$BINARY" ]]; then
  for cand in "$REPO/target/release/crisp" "$REPO/target/debug/crisp"; do
    if [[ -x "$cand" ]]; then BINARY="$cand"; break; fi
  done
  [[ -n "$BINARY" ]] || die "no crisp binary found in $REPO/target/{release,debug}/: build it (cargo build --release) or pass --binary FILE"
fi
[[ -f "$BINARY" && -x "$BINARY" ]] || die "--binary $BINARY is not an executable file"
units=("$REPO/systemd/kubelet.service.d/90-crisp.conf")
[[ "$PACKAGED" -eq 1 ]] || units+=("$REPO/systemd/crisp.service" "$REPO/systemd/crisp.socket")
for f in "${units[@]}"; do
  [[ -f "$f" ]] || die "missing unit file $f (run this script from a crisp checkout)"
done
if [[ -n "$CONFIG_SRC" ]]; then
  [[ -f "$CONFIG_SRC" ]] || die "--config $CONFIG_SRC: no such file"
  "$BINARY" --check-config --config "$CONFIG_SRC" >/dev/null || die "--config $CONFIG_SRC is not a valid crisp config (see the error above)"
fi

# ---- kubelet version ------------------------------------------------------------------------

KV_MAJOR=""
KV_MINOR=""
kv_source=""
if [[ -n "$KUBELET_VERSION" ]]; then
  kv_source="--kubelet-version"
elif [[ "$ROOT" == / ]] && command -v kubelet >/dev/null 2>&1; then
  KUBELET_VERSION="$(kubelet --version 2>/dev/null | awk '{print $NF}')" || KUBELET_VERSION=""
  kv_source="kubelet --version"
fi
if [[ -n "$KUBELET_VERSION" ]]; then
  if [[ "$KUBELET_VERSION" =~ ^v?([0-9]+)\.([0-9]+) ]]; then
    KV_MAJOR="${BASH_REMATCH[1]}"
    KV_MINOR="${BASH_REMATCH[2]}"
  else
    die "cannot parse kubelet version '$KUBELET_VERSION' (from $kv_source); pass --kubelet-version 1.27"
  fi
fi
# kubelet_at_least MINOR: known and >= 1.MINOR
kubelet_at_least() {
  [[ -n "$KV_MAJOR" ]] && { [[ "$KV_MAJOR" -gt 1 ]] || [[ "$KV_MINOR" -ge "$1" ]]; }
}
kubelet_below() {
  [[ -n "$KV_MAJOR" ]] && [[ "$KV_MAJOR" -eq 1 ]] && [[ "$KV_MINOR" -lt "$1" ]]
}

# ---- staging: compute every target's desired content first; nothing is written to ROOT -------

STAGE="$(mktemp -d "${TMPDIR:-/tmp}/crisp-install.XXXXXX")"
trap 'rm -rf "$STAGE"' EXIT

# Parallel arrays: the plan. kind: file (content in $STAGE<path>) | link (target in LINK_TO).
PLAN_PATH=()
PLAN_KIND=()
PLAN_MODE=()
PLAN_PHASE=()   # crisp | kubelet: kubelet's files change only once crisp serves
declare -A LINK_TO=()

plan_file() { # node-path mode phase  (content already in $STAGE/node-path)
  PLAN_PATH+=("$1"); PLAN_KIND+=(file); PLAN_MODE+=("$2"); PLAN_PHASE+=("$3")
}
plan_link() { # node-path target phase
  PLAN_PATH+=("$1"); PLAN_KIND+=(link); PLAN_MODE+=(-); PLAN_PHASE+=("$3"); LINK_TO["$1"]="$2"
}
stage() { # node-path -> staged path (parent created)
  mkdir -p "$STAGE$(dirname "$1")"
  printf '%s' "$STAGE$1"
}

# Refuse to edit through symlinks: the backup/restore would replace the link with a file.
check_regular() {
  local p
  p="$(r "$1")"
  if [[ -L "$p" ]]; then
    die "$p is a symlink; edit its target by hand to use $CRISP_ENDPOINT (crisp's installer does not follow links)"
  fi
  if [[ -e "$p" && ! -f "$p" ]]; then
    die "$p exists but is not a regular file"
  fi
}

# -- kubelet's endpoint settings --

# Reads a top-level `key: value` of a block-style YAML file (last wins), unquoted.
yaml_get() { # file key
  awk -v k="$2" -v sq="'" '
    index($0, k ":") == 1 {
      v = substr($0, length(k) + 2)
      sub(/[ \t]+#.*$/, "", v); gsub(/^[ \t]+|[ \t]+$/, "", v)
      if (length(v) >= 2 && (substr(v, 1, 1) == "\"" || substr(v, 1, 1) == sq) && substr(v, length(v), 1) == substr(v, 1, 1)) v = substr(v, 2, length(v) - 2)
      out = v; found = 1
    }
    END { if (found) print out }' "$1"
}

# The unquoted value of the last VAR=... line of an EnvironmentFile ("" if none).
env_get() { # file var
  awk -v k="$2" -v sq="'" '
    { line = $0; sub(/^[ \t]+/, "", line) }
    line ~ /^[#;]/ { next }
    index(line, k "=") == 1 {
      v = substr(line, length(k) + 2); gsub(/^[ \t]+|[ \t]+$/, "", v)
      if (length(v) >= 2 && (substr(v, 1, 1) == "\"" || substr(v, 1, 1) == sq) && substr(v, length(v), 1) == substr(v, 1, 1)) v = substr(v, 2, length(v) - 2)
      out = v
    }
    END { print out }' "$1"
}

# Last value of --flag=v / --flag v in an argument string.
flag_get() { # args flag
  local -a toks
  local i val=""
  read -ra toks <<<"$1"
  for ((i = 0; i < ${#toks[@]}; i++)); do
    case "${toks[i]}" in
      "$2"=*) val="${toks[i]#*=}" ;;
      "$2") if ((i + 1 < ${#toks[@]})); then val="${toks[i + 1]}"; i=$((i + 1)); fi ;;
    esac
  done
  printf '%s' "$val"
}

# Writes FILE's edited copy to the stage. Every VAR= line gets its endpoints pointed at crisp
# (and --container-runtime dropped when drop=1); with add=1 the last VAR= line gets
# --container-runtime-endpoint appended, or a VAR= line is added. A line that needs no change is
# kept byte for byte (so is the rest of the file); a changed line keeps its quotes and has its
# arguments joined by single spaces.
stage_env_edit() { # node-path var drop add
  local src dst appended
  src="$(r "$1")"
  dst="$(stage "$1")"
  awk -v k="$2" -v drop="$3" -v add="$4" -v ep="$CRISP_ENDPOINT" -v sq="'" '
    function rewrite(args, add_ep,    n, t, i, out, sep) {
      n = split(args, t, /[ \t]+/); out = ""; sep = ""
      for (i = 1; i <= n; i++) {
        if (t[i] == "") continue
        if (t[i] ~ /^--(container-runtime-endpoint|image-service-endpoint)=/) sub(/=.*/, "=" ep, t[i])
        else if (t[i] == "--container-runtime-endpoint" || t[i] == "--image-service-endpoint") { t[i] = t[i] "=" ep; i++; out = out sep t[i - 1]; sep = " "; continue }
        else if (drop && t[i] ~ /^--container-runtime=/) continue
        else if (drop && t[i] == "--container-runtime") { i++; continue }
        out = out sep t[i]; sep = " "
      }
      if (add_ep) out = out sep "--container-runtime-endpoint=" ep
      return out
    }
    function normalized(args,    n, t, i, out, sep) {
      n = split(args, t, /[ \t]+/); out = ""; sep = ""
      for (i = 1; i <= n; i++) if (t[i] != "") { out = out sep t[i]; sep = " " }
      return out
    }
    {
      line[NR] = $0
      body = $0; sub(/^[ \t]+/, "", body)
      if (body !~ /^[#;]/ && index(body, k "=") == 1) { isvar[NR] = 1; last = NR }
    }
    END {
      for (i = 1; i <= NR; i++) {
        if (!isvar[i]) { print line[i]; continue }
        lead = line[i]; sub(/[^ \t].*$/, "", lead)
        v = substr(line[i], length(lead) + length(k) + 2); q = ""
        if (length(v) >= 2 && (substr(v, 1, 1) == "\"" || substr(v, 1, 1) == sq) && substr(v, length(v), 1) == substr(v, 1, 1)) { q = substr(v, 1, 1); v = substr(v, 2, length(v) - 2) }
        add_ep = add && i == last
        new = rewrite(v, add_ep)
        if (!add_ep && new == normalized(v)) print line[i]
        else print lead k "=" q new q
      }
      if (add && !last) print k "=\"--container-runtime-endpoint=" ep "\""
    }
  ' "$src" >"$dst.awk"
  appended=0
  if [[ "$4" -eq 1 && -z "$(env_has_var "$src" "$2")" ]]; then appended=1; fi
  keep_final_newline "$src" "$dst.awk" "$dst" "$appended"
}

# awk ends every line with a newline; a file that had none at the end keeps having none
# (unless a line was appended).
keep_final_newline() { # original awk-output destination appended
  if [[ -s "$1" && -n "$(tail -c1 "$1")" && "$4" -eq 0 ]]; then
    head -c -1 "$2" >"$3"
  else
    cat "$2" >"$3"
  fi
  rm -f "$2"
}

env_has_var() { # file var -> prints "y" if a VAR= line exists
  awk -v k="$2" '{ l = $0; sub(/^[ \t]+/, "", l) } l !~ /^[#;]/ && index(l, k "=") == 1 { f = 1 } END { if (f) print "y" }' "$1"
}

# YAML: points the top-level containerRuntimeEndpoint / imageServiceEndpoint at crisp (lines
# already pointing there are kept as they are); with add=1 and no containerRuntimeEndpoint,
# appends one.
stage_yaml_edit() { # node-path add
  local src dst appended=0
  src="$(r "$1")"
  dst="$(stage "$1")"
  awk -v add="$2" -v ep="$CRISP_ENDPOINT" -v sq="'" '
    function value(l,    v) {
      v = substr(l, index(l, ":") + 1)
      sub(/[ \t]+#.*$/, "", v); gsub(/^[ \t]+|[ \t]+$/, "", v)
      if (length(v) >= 2 && (substr(v, 1, 1) == "\"" || substr(v, 1, 1) == sq) && substr(v, length(v), 1) == substr(v, 1, 1)) v = substr(v, 2, length(v) - 2)
      return v
    }
    index($0, "containerRuntimeEndpoint:") == 1 || index($0, "imageServiceEndpoint:") == 1 {
      if (index($0, "containerRuntimeEndpoint:") == 1) seen = 1
      if (value($0) == ep) print; else print substr($0, 1, index($0, ":")) " " ep
      next
    }
    { print }
    END { if (add && !seen) print "containerRuntimeEndpoint: " ep }
  ' "$src" >"$dst.awk"
  if [[ "$2" -eq 1 ]] && ! grep -q '^containerRuntimeEndpoint:' "$src"; then
    appended=1
  fi
  keep_final_newline "$src" "$dst.awk" "$dst" "$appended"
}

# Collect what kubelet currently uses, lowest precedence first: config file, kubeadm flags,
# extra args (10-kubeadm.conf: $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS).
cur_endpoint=""
cur_endpoint_src=""
runtime_flag_files=()
kubelet_files=()
if [[ -f "$(r "$KUBELET_CONFIG")" ]]; then
  check_regular "$KUBELET_CONFIG"
  kubelet_files+=("$KUBELET_CONFIG")
  head -c 64 "$(r "$KUBELET_CONFIG")" | grep -q '^[[:space:]]*{' \
    && die "$(r "$KUBELET_CONFIG") is JSON; crisp's installer edits YAML only: set containerRuntimeEndpoint to $CRISP_ENDPOINT by hand"
  v="$(yaml_get "$(r "$KUBELET_CONFIG")" containerRuntimeEndpoint)"
  if [[ -n "$v" ]]; then cur_endpoint="$v"; cur_endpoint_src="$KUBELET_CONFIG"; fi
fi
declare -A ARGS_VAR=(["$KUBEADM_FLAGS"]=KUBELET_KUBEADM_ARGS)
for f in "${EXTRA_ARGS_FILES[@]}"; do ARGS_VAR["$f"]=KUBELET_EXTRA_ARGS; done
for f in "$KUBEADM_FLAGS" "${EXTRA_ARGS_FILES[@]}"; do
  [[ -f "$(r "$f")" ]] || continue
  check_regular "$f"
  kubelet_files+=("$f")
  args="$(env_get "$(r "$f")" "${ARGS_VAR[$f]}")"
  v="$(flag_get "$args" --container-runtime-endpoint)"
  if [[ -n "$v" ]]; then cur_endpoint="$v"; cur_endpoint_src="$f"; fi
  if [[ -n "$(flag_get "$args" --container-runtime)" ]]; then runtime_flag_files+=("$f"); fi
done
if [[ ${#kubelet_files[@]} -eq 0 ]]; then
  die "no kubelet configuration under $ROOT (looked for $KUBELET_CONFIG, $KUBEADM_FLAGS, ${EXTRA_ARGS_FILES[*]}). Is this a kubeadm-style node? Pass --kubelet-config FILE, or set kubelet's --container-runtime-endpoint=$CRISP_ENDPOINT by hand"
fi

# Where to add an endpoint if no file sets one.
add_to=""
if [[ -z "$cur_endpoint" ]]; then
  if kubelet_below 24; then
    die "kubelet $KUBELET_VERSION has no --container-runtime-endpoint set, so it uses the built-in dockershim; crisp needs a CRI runtime (containerd)"
  fi
  if kubelet_at_least 27 && [[ -f "$(r "$KUBELET_CONFIG")" ]]; then
    add_to="$KUBELET_CONFIG"
  elif [[ -f "$(r "$KUBEADM_FLAGS")" ]]; then
    add_to="$KUBEADM_FLAGS"
  else
    for f in "${EXTRA_ARGS_FILES[@]}"; do
      if [[ -f "$(r "$f")" ]]; then add_to="$f"; break; fi
    done
    [[ -n "$add_to" ]] || add_to="$KUBELET_CONFIG"   # only the config file exists
  fi
fi

drop_runtime_flag=0
if [[ ${#runtime_flag_files[@]} -gt 0 ]]; then
  if kubelet_at_least 27; then
    drop_runtime_flag=1
  elif [[ -z "$KV_MAJOR" ]]; then
    note "kubelet version unknown (not detected under --root, or no kubelet on PATH): keeping --container-runtime in ${runtime_flag_files[*]}; kubelet 1.27+ rejects it, pass --kubelet-version to decide"
  fi
fi

# The runtime crisp forwards to: what kubelet used before crisp.
upstream="$DEFAULT_UPSTREAM"
if [[ -n "$cur_endpoint" ]]; then
  ep_path="${cur_endpoint#unix://}"
  if [[ "$ep_path" == "$CRISP_SOCK" ]]; then
    : # already crisp (re-run, or set by hand): keep the default
  elif [[ "$ep_path" == /* ]]; then
    upstream="$ep_path"
  else
    die "kubelet's runtime endpoint '$cur_endpoint' (in $(r "$cur_endpoint_src")) is not a unix socket; crisp proxies unix sockets only"
  fi
fi

for f in "${kubelet_files[@]}"; do
  add=0
  [[ "$f" == "$add_to" ]] && add=1
  if [[ "$f" == "$KUBELET_CONFIG" ]]; then
    stage_yaml_edit "$f" "$add"
  else
    stage_env_edit "$f" "${ARGS_VAR[$f]}" "$drop_runtime_flag" "$add"
  fi
  plan_file "$f" keep kubelet
done

# -- crisp's own files --

if [[ "$PACKAGED" -eq 0 ]]; then
  cp "$BINARY" "$(stage "$BIN_DST")"
  plan_file "$BIN_DST" 0755 crisp
fi
# A config already there forwards to its own upstream: pointing kubelet through crisp to another
# runtime than the one kubelet uses now would swap the node's runtime under its running pods.
if [[ -z "$CONFIG_SRC" && -f "$(r "$CONFIG_DST")" && -n "$cur_endpoint" && "${cur_endpoint#unix://}" != "$CRISP_SOCK" ]]; then
  cfg_upstream="$("$BINARY" --check-config --config "$(r "$CONFIG_DST")" 2>/dev/null | sed -n 's/^ *upstream: "\(.*\)",$/\1/p')"
  # (A config crisp cannot read stops crisp itself, and so the install, before kubelet's turn.)
  [[ -z "$cfg_upstream" || "$cfg_upstream" == "${cur_endpoint#unix://}" ]] \
    || die "$CONFIG_DST forwards to $cfg_upstream but kubelet uses $cur_endpoint (in $cur_endpoint_src): set upstream = \"${cur_endpoint#unix://}\" in $CONFIG_DST first"
fi
if [[ -n "$CONFIG_SRC" ]]; then
  cp "$CONFIG_SRC" "$(stage "$CONFIG_DST")"
  plan_file "$CONFIG_DST" 0644 crisp
elif [[ ! -e "$(r "$CONFIG_DST")" ]]; then
  [[ "$upstream" != *[\"\\]* ]] || die "runtime socket path '$upstream' contains a quote or backslash"
  cat >"$(stage "$CONFIG_DST")" <<EOF
# crisp configuration, written by hack/install.sh (keys: docs/INSTALL.md).
# Validate with \`crisp --check-config\`; check the node with \`crisp doctor\`.

# kubelet's runtime endpoint; must equal ListenStream= in $UNIT_DIR/crisp.socket.
listen = "$CRISP_SOCK"
# The runtime's socket: kubelet's endpoint before crisp was installed.
upstream = "$upstream"
EOF
  plan_file "$CONFIG_DST" 0644 crisp
fi
if [[ "$PACKAGED" -eq 0 ]]; then
  for u in crisp.service crisp.socket; do
    cp "$REPO/systemd/$u" "$(stage "$UNIT_DIR/$u")"
    plan_file "$UNIT_DIR/$u" 0644 crisp
  done
  # `systemctl enable` by hand (same symlinks as the units' [Install] sections), so that it also
  # works on a node root without a running systemd, and uninstall knows exactly what to remove.
  plan_link "$UNIT_DIR/sockets.target.wants/crisp.socket" "$UNIT_DIR/crisp.socket" crisp
  plan_link "$UNIT_DIR/multi-user.target.wants/crisp.service" "$UNIT_DIR/crisp.service" crisp
fi
cp "$REPO/systemd/kubelet.service.d/90-crisp.conf" "$(stage "$DROPIN_DST")"
plan_file "$DROPIN_DST" 0644 kubelet

# ---- compare the plan with the node ------------------------------------------------------------

ACTION=()   # per plan entry: none | create | modify
for i in "${!PLAN_PATH[@]}"; do
  p="${PLAN_PATH[i]}"
  dst="$(r "$p")"
  if [[ "${PLAN_KIND[i]}" == link ]]; then
    if [[ -L "$dst" && "$(readlink "$dst")" == "${LINK_TO[$p]}" ]]; then
      ACTION+=(none)
    elif [[ -e "$dst" || -L "$dst" ]]; then
      die "$dst exists and is not the symlink to ${LINK_TO[$p]} that enabling crisp needs; remove it"
    else
      ACTION+=(create)
    fi
    continue
  fi
  if [[ ! -e "$dst" && ! -L "$dst" ]]; then
    ACTION+=(create)
  else
    check_regular "$p"
    if cmp -s "$STAGE$p" "$dst" && { [[ "${PLAN_MODE[i]}" == keep ]] || [[ "$(stat -c %a "$dst")" == "${PLAN_MODE[i]#0}" ]]; }; then
      ACTION+=(none)
    else
      ACTION+=(modify)
    fi
  fi
done

changes=0
kubelet_changed=0
crisp_changed=0
for i in "${!ACTION[@]}"; do
  if [[ "${ACTION[i]}" != none ]]; then
    changes=$((changes + 1))
    if [[ "${PLAN_PHASE[i]}" == kubelet ]]; then kubelet_changed=1; else crisp_changed=1; fi
  fi
done

if [[ "$DRY_RUN" -eq 1 ]]; then
  note "dry run: nothing is changed (root $ROOT)"
  [[ -n "$KV_MAJOR" ]] && note "kubelet version $KV_MAJOR.$KV_MINOR (from $kv_source)"
  for i in "${!PLAN_PATH[@]}"; do
    p="${PLAN_PATH[i]}"
    case "${ACTION[i]}" in
      none) ;;
      create)
        if [[ "${PLAN_KIND[i]}" == link ]]; then
          echo "would create symlink $p -> ${LINK_TO[$p]}"
        elif [[ "$p" == "$BIN_DST" ]]; then
          echo "would create $p (mode ${PLAN_MODE[i]}) from $BINARY"
        elif [[ "$p" != "$CONFIG_DST" ]]; then
          echo "would create $p (mode ${PLAN_MODE[i]}) from systemd/$(basename "$p")"
        else
          echo "would create $p (mode ${PLAN_MODE[i]}):"
          sed 's/^/    /' "$STAGE$p"
        fi ;;
      modify)
        backup="$STATE/backup$p"
        [[ -e "$(r "$backup")" ]] && backup="$backup (kept from the first install)"
        if [[ "$p" == "$BIN_DST" ]]; then
          echo "would replace $p from $BINARY (original backed up to $backup)"
        else
          echo "would change $p (original backed up to $backup):"
          diff -u --label "$p" --label "$p (with crisp)" "$(r "$p")" "$STAGE$p" | sed 's/^/    /' || true
        fi ;;
    esac
  done
  if [[ "$changes" -eq 0 ]]; then
    note "already installed: nothing would change"
  elif [[ "$ROOT" != / ]]; then
    note "would not start or restart anything (--root is not /)"
  else
    [[ "$crisp_changed" -eq 1 ]] && note "would (re)start crisp.socket and crisp.service"
    [[ "$kubelet_changed" -eq 1 ]] && note "would restart kubelet.service"
  fi
  exit 0
fi

# ---- apply --------------------------------------------------------------------------------------

MANIFEST="$(r "$STATE/manifest")"

manifest_has() { [[ -f "$MANIFEST" ]] && grep -qxF "$1" "$MANIFEST"; }
manifest_add() { manifest_has "$1" || echo "$1" >>"$MANIFEST"; }

# mkdir -p that records each directory it creates (uninstall removes them if empty).
mkdirs() { # node-dir
  local d="$1" missing=()
  while [[ "$d" != / && ! -d "$(r "$d")" ]]; do
    missing=("$d" "${missing[@]}")
    d="$(dirname "$d")"
  done
  for d in "${missing[@]}"; do
    mkdir -m 0755 "$(r "$d")"
    if [[ "$d" == "$STATE" || "$d" == "$STATE"/* ]]; then continue; fi
    pending_dirs+=("$d")
  done
}
pending_dirs=()

# The state directory first (it holds the manifest that records everything else).
if [[ ! -d "$(r "$STATE")" ]]; then
  mkdirs "$STATE"
  state_dirs=("${pending_dirs[@]}")
  pending_dirs=()
  : >"$MANIFEST"
  chmod 0600 "$MANIFEST"
  for d in "${state_dirs[@]}"; do manifest_add "dir $d"; done
fi
flush_dirs() {
  local d
  for d in "${pending_dirs[@]}"; do manifest_add "dir $d"; done
  pending_dirs=()
}

# Atomic replace, keeping the existing file's owner and mode (or setting MODE for new files).
put_file() { # staged node-path mode
  local dst tmp
  dst="$(r "$2")"
  tmp="$(mktemp "$(dirname "$dst")/.crisp-install.XXXXXX")"
  cat "$1" >"$tmp"
  if [[ -e "$dst" ]]; then
    chown --reference="$dst" "$tmp"
    chmod --reference="$dst" "$tmp"
  fi
  if [[ "$3" != keep ]]; then chmod "$3" "$tmp"; fi
  mv -f "$tmp" "$dst"
}

record_installed() { # node-path: hash of what we wrote, to detect later edits on uninstall
  local h
  h="$(r "$STATE/installed$1.sha256")"
  mkdir -p "$(dirname "$h")"
  sha256sum <"$(r "$1")" | awk '{print $1}' >"$h"
}

changed_since_install() { # node-path: true if its content is not what we last wrote
  local h
  h="$(r "$STATE/installed$1.sha256")"
  [[ -f "$h" ]] || return 0
  [[ "$(sha256sum <"$(r "$1")" | awk '{print $1}')" != "$(cat "$h")" ]]
}

apply_phase() { # crisp | kubelet
  local i p dst backup
  for i in "${!PLAN_PATH[@]}"; do
    [[ "${PLAN_PHASE[i]}" == "$1" ]] || continue
    p="${PLAN_PATH[i]}"
    dst="$(r "$p")"
    case "${ACTION[i]}" in
      none) continue ;;
      create)
        mkdirs "$(dirname "$p")"
        flush_dirs
        if [[ "${PLAN_KIND[i]}" == link ]]; then
          ln -s "${LINK_TO[$p]}" "$dst"
          manifest_add "link $p"
          note "enabled: $p -> ${LINK_TO[$p]}"
        else
          put_file "$STAGE$p" "$p" "${PLAN_MODE[i]}"
          if ! manifest_has "modified $p"; then manifest_add "created $p"; fi
          record_installed "$p"
          note "created $p"
        fi ;;
      modify)
        backup="$(r "$STATE/backup$p")"
        if ! manifest_has "modified $p" && ! manifest_has "created $p"; then
          mkdir -p "$(dirname "$backup")"
          cp -p "$dst" "$backup"
          manifest_add "modified $p"
          note "backed up $p to $STATE/backup$p"
        elif manifest_has "modified $p" && changed_since_install "$p"; then
          # Someone rewrote it after we did (kubeadm upgrade, an operator): that version is
          # what uninstall must give back now.
          cp -p "$dst" "$backup"
          note "$p was changed since crisp was installed: backed up the new version to $STATE/backup$p"
        fi
        put_file "$STAGE$p" "$p" "${PLAN_MODE[i]}"
        record_installed "$p"
        note "updated $p" ;;
    esac
  done
}

systemctl_live() {
  note "systemctl $*"
  systemctl "$@"
}

apply_phase crisp
if [[ "$LIVE" -eq 1 ]]; then
  systemctl_live daemon-reload
  systemctl_live start crisp.socket
  if [[ "$crisp_changed" -eq 1 ]]; then
    systemctl_live restart crisp.service \
      || die "crisp.service did not start (journalctl -u crisp); kubelet was NOT changed. Fix it and re-run, or undo with hack/uninstall.sh"
  else
    systemctl_live start crisp.service || die "crisp.service did not start (journalctl -u crisp); kubelet was NOT changed"
  fi
  if ! "$(r "$BIN_DST")" doctor >"$STAGE/doctor.out" 2>&1; then
    if grep -q '^\[FAIL\] \(upstream\|crisp-socket\|config\)' "$STAGE/doctor.out"; then
      cat "$STAGE/doctor.out" >&2
      die "crisp is not serving correctly (see crisp doctor above); kubelet was NOT changed"
    fi
  fi
fi
apply_phase kubelet

if [[ "$changes" -eq 0 ]]; then
  note "already installed under $ROOT: nothing changed"
fi
if [[ "$LIVE" -eq 1 ]]; then
  if [[ "$kubelet_changed" -eq 1 ]]; then
    systemctl_live daemon-reload
    systemctl_live restart kubelet.service \
      || die "kubelet.service did not restart (journalctl -u kubelet); undo with hack/uninstall.sh"
  fi
  note "done; check the node with: crisp doctor"
elif [[ "$changes" -gt 0 ]]; then
  if [[ "$ROOT" != / ]]; then
    note "not starting or restarting anything: --root is not /"
  else
    note "not restarting anything (--no-restart, or systemd is not running); to finish:"
    note "  systemctl daemon-reload && systemctl start crisp.socket crisp.service && systemctl restart kubelet"
  fi
fi
