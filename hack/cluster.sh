#!/usr/bin/env bash
# A real Kubernetes 1.26 control plane on this host, for the cluster lane of the end-to-end suite
# (tests/it/cluster_rollout.rs, docs/DEPLOY.md "The cluster lane"): etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler and a local image registry, all on 127.0.0.1 with
# ports no default install uses, everything under one state directory.
#
#   hack/cluster.sh up STATE      PKI, tokens, start everything, wait until the API answers
#   hack/cluster.sh env STATE     prints `export KUBECONFIG=...` (eval it)
#   hack/cluster.sh down STATE    stops what `up` started (by its pid files) and removes STATE's
#                                 data; STATE/log stays for a post-mortem
#
# Binaries: KUBE_BIN_DIR holds kube-apiserver, kube-controller-manager and kube-scheduler
# (hack/kube-binaries.sh builds them offline); KUBE_APISERVER, KUBE_CONTROLLER_MANAGER,
# KUBE_SCHEDULER name one each instead. ETCD (default: etcd on PATH, Debian's etcd-server) and
# REGISTRY (default: docker-registry on PATH, Debian's docker-registry; REGISTRY=none for no
# registry). Nothing is downloaded.
#
# What STATE holds after `up`:
#   pki/ca.crt                    the cluster CA (also the kubelet's client CA)
#   admin.kubeconfig              system:masters, static token
#   node/<NODE>.kubeconfig        system:node:<NODE> in system:nodes (NODE: CLUSTER_NODE_NAME,
#                                 default crisp-node, the nspawn node's hostname), static token,
#                                 CA embedded: what a kubelet on that node needs to join
#   ports                         shell assignments: APISERVER_PORT, REGISTRY_PORT, ...
#   log/*.log                     each component's log
#
# Authorization is Node,RBAC (what kubeadm sets): the node's kubelet gets exactly a node's rights.
# The API server reaches kubelets (logs, exec) with a client certificate in system:masters.
# Ports (override by environment): etcd 23790/23800, API server 16443, controller-manager
# 20257, scheduler 20259, registry 15000. CLUSTER_FEATURE_GATES (e.g. ImageVolume=true) is
# passed to the API server as --feature-gates (tests/it/cluster_runtimes.rs's image volume).
set -euo pipefail

PROG=hack/cluster.sh
die() {
  echo "$PROG: error: $*" >&2
  exit 1
}
note() {
  echo "$PROG: $*" >&2
}

[[ $# -eq 2 ]] || die "usage: $0 up|env|down STATE"
cmd=$1
mkdir -p "$2"
STATE=$(cd "$2" && pwd)

ETCD_PORT=${ETCD_PORT:-23790}
ETCD_PEER_PORT=${ETCD_PEER_PORT:-23800}
APISERVER_PORT=${APISERVER_PORT:-16443}
CM_PORT=${CM_PORT:-20257}
SCHEDULER_PORT=${SCHEDULER_PORT:-20259}
REGISTRY_PORT=${REGISTRY_PORT:-15000}
NODE=${CLUSTER_NODE_NAME:-crisp-node}
SERVICE_CIDR=${SERVICE_CIDR:-10.96.0.0/16}
SERVER=https://127.0.0.1:$APISERVER_PORT
COMPONENTS=(registry etcd kube-apiserver kube-controller-manager kube-scheduler)

bin() { # bin VAR NAME: $VAR, else $KUBE_BIN_DIR/NAME
  local v=${!1:-}
  if [[ -z $v ]]; then
    [[ -n ${KUBE_BIN_DIR:-} ]] || die "set KUBE_BIN_DIR (hack/kube-binaries.sh builds $2) or $1"
    v=$KUBE_BIN_DIR/$2
  fi
  [[ -x $v ]] || die "$1: $v is not an executable"
  printf '%s' "$v"
}

pidfile() { printf '%s/run/%s.pid' "$STATE" "$1"; }

stop() {
  local c pid
  # In reverse: the API server's clients first, etcd last.
  for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do
    c=${COMPONENTS[i]}
    [[ -f $(pidfile "$c") ]] || continue
    pid=$(cat "$(pidfile "$c")")
    # Only what this script started: the pid file's process, if it still runs the binary we
    # started (a recycled pid is left alone).
    if [[ -n $pid && -r /proc/$pid/cmdline ]] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$STATE"; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 100); do
        [[ -e /proc/$pid ]] || break
        sleep 0.1
      done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$(pidfile "$c")"
  done
}

# start NAME CMD...: in the background, in its own session, log in STATE/log/NAME.log.
start() {
  local name=$1
  shift
  setsid "$@" >>"$STATE/log/$name.log" 2>&1 </dev/null &
  echo $! >"$(pidfile "$name")"
}

alive_or_die() {
  local pid
  pid=$(cat "$(pidfile "$1")")
  [[ -e /proc/$pid ]] || die "$1 exited: $(tail -20 "$STATE/log/$1.log")"
}

# wait_for NAME SECONDS CMD...: until CMD succeeds, or die with NAME's log.
wait_for() {
  local name=$1 secs=$2
  shift 2
  local end=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    alive_or_die "$name"
    ((SECONDS < end)) || die "$name not up after ${secs}s: $(tail -20 "$STATE/log/$name.log")"
    sleep 0.2
  done
}

kubeconfig() { # kubeconfig FILE USER TOKEN
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: crisp-lane
  cluster:
    server: $SERVER
    certificate-authority-data: $(base64 -w0 <"$STATE/pki/ca.crt")
users:
- name: $2
  user:
    token: $3
contexts:
- name: crisp-lane
  context: {cluster: crisp-lane, user: $2}
current-context: crisp-lane
EOF
  chmod 0600 "$1"
}

pki() {
  local p=$STATE/pki
  mkdir -p "$p"
  chmod 0700 "$p"
  local ossl=(openssl)
  "${ossl[@]}" req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=crisp-lane-ca" \
    -keyout "$p/ca.key" -out "$p/ca.crt" 2>/dev/null
  # The API server's serving certificate: 127.0.0.1, localhost and the kubernetes Service's IP.
  local svc_ip
  svc_ip=$(python3 -c "import ipaddress,sys; print(ipaddress.ip_network(sys.argv[1])[1])" "$SERVICE_CIDR")
  "${ossl[@]}" req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" -keyout "$p/apiserver.key" -out "$p/apiserver.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,IP:%s,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth\n' "$svc_ip" >"$p/apiserver.ext"
  "${ossl[@]}" x509 -req -in "$p/apiserver.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial -days 2 -extfile "$p/apiserver.ext" -out "$p/apiserver.crt" 2>/dev/null
  # The API server's client certificate towards kubelets (logs, exec, port-forward).
  "${ossl[@]}" req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" -keyout "$p/apiserver-kubelet-client.key" -out "$p/akc.csr" 2>/dev/null
  printf 'extendedKeyUsage=clientAuth\n' >"$p/client.ext"
  "${ossl[@]}" x509 -req -in "$p/akc.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial -days 2 -extfile "$p/client.ext" -out "$p/apiserver-kubelet-client.crt" 2>/dev/null
  # Service-account token signing.
  "${ossl[@]}" genrsa -out "$p/sa.key" 2048 2>/dev/null
  "${ossl[@]}" rsa -in "$p/sa.key" -pubout -out "$p/sa.pub" 2>/dev/null
  rm -f "$p"/*.csr "$p"/*.ext
  # Static tokens: token,user,uid,"groups".
  local t_admin t_cm t_sched t_node
  t_admin=$(openssl rand -hex 16)
  t_cm=$(openssl rand -hex 16)
  t_sched=$(openssl rand -hex 16)
  t_node=$(openssl rand -hex 16)
  {
    echo "$t_admin,crisp-lane-admin,uid-admin,\"system:masters\""
    echo "$t_cm,system:kube-controller-manager,uid-cm,"
    echo "$t_sched,system:kube-scheduler,uid-sched,"
    echo "$t_node,system:node:$NODE,uid-node,\"system:nodes\""
  } >"$p/tokens.csv"
  chmod 0600 "$p/tokens.csv"
  kubeconfig "$STATE/admin.kubeconfig" crisp-lane-admin "$t_admin"
  kubeconfig "$STATE/controller-manager.kubeconfig" system:kube-controller-manager "$t_cm"
  kubeconfig "$STATE/scheduler.kubeconfig" system:kube-scheduler "$t_sched"
  mkdir -p "$STATE/node"
  kubeconfig "$STATE/node/$NODE.kubeconfig" "system:node:$NODE" "$t_node"
}

up() {
  local apiserver cm sched etcd registry
  apiserver=$(bin KUBE_APISERVER kube-apiserver)
  cm=$(bin KUBE_CONTROLLER_MANAGER kube-controller-manager)
  sched=$(bin KUBE_SCHEDULER kube-scheduler)
  etcd=${ETCD:-$(command -v etcd || true)}
  [[ -x $etcd ]] || die "no etcd (ETCD=, or Debian's etcd-server: hack/setup.sh)"
  registry=${REGISTRY:-$(command -v docker-registry || true)}
  [[ $registry == none || -x $registry ]] || die "no registry (REGISTRY=, REGISTRY=none, or Debian's docker-registry: hack/setup.sh)"
  for c in "${COMPONENTS[@]}"; do
    [[ ! -f $(pidfile "$c") ]] || die "$STATE already has a running $c: $0 down $STATE first"
  done
  mkdir -p "$STATE/run" "$STATE/log"
  # Whatever way up fails (a die, a failed command), what it started is stopped.
  trap 'note "up failed: stopping what started"; stop' EXIT
  pki
  local t0=$SECONDS
  cat >"$STATE/ports" <<EOF
ETCD_PORT=$ETCD_PORT
APISERVER_PORT=$APISERVER_PORT
CM_PORT=$CM_PORT
SCHEDULER_PORT=$SCHEDULER_PORT
REGISTRY_PORT=$REGISTRY_PORT
NODE=$NODE
EOF

  if [[ $registry != none ]]; then
    mkdir -p "$STATE/registry"
    cat >"$STATE/registry.yml" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $STATE/registry
http:
  addr: 127.0.0.1:$REGISTRY_PORT
EOF
    start registry "$registry" serve "$STATE/registry.yml"
  fi

  start etcd "$etcd" --name crisp-lane --data-dir "$STATE/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "crisp-lane=http://127.0.0.1:$ETCD_PEER_PORT" --log-level warn
  wait_for etcd 60 curl -fsS "http://127.0.0.1:$ETCD_PORT/health"

  local p=$STATE/pki
  # --endpoint-reconciler-type none: the kubernetes Service's endpoint would be 127.0.0.1, which
  # the API refuses (loopback), logged every 10 s; no pod of the lane talks to the API.
  start kube-apiserver "$apiserver" \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$APISERVER_PORT" \
    --tls-cert-file "$p/apiserver.crt" --tls-private-key-file "$p/apiserver.key" \
    --client-ca-file "$p/ca.crt" --token-auth-file "$p/tokens.csv" \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    --kubelet-client-certificate "$p/apiserver-kubelet-client.crt" --kubelet-client-key "$p/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types InternalIP,Hostname \
    --service-account-issuer https://kubernetes.default.svc --service-account-key-file "$p/sa.pub" \
    --service-account-signing-key-file "$p/sa.key" --service-cluster-ip-range "$SERVICE_CIDR" \
    --allow-privileged=true --cert-dir "$STATE/apiserver-certs" --profiling=false \
    --endpoint-reconciler-type none ${CLUSTER_FEATURE_GATES:+--feature-gates "$CLUSTER_FEATURE_GATES"}
  wait_for kube-apiserver 120 curl -fsS --cacert "$p/ca.crt" "$SERVER/readyz"

  start kube-controller-manager "$cm" --kubeconfig "$STATE/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$STATE/controller-manager.kubeconfig" --authorization-kubeconfig "$STATE/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$CM_PORT" --cert-dir "$STATE/cm-certs" --leader-elect=false \
    --service-account-private-key-file "$p/sa.key" --root-ca-file "$p/ca.crt" --use-service-account-credentials=true \
    --service-cluster-ip-range "$SERVICE_CIDR" --controllers '*,-nodeipam' --profiling=false
  start kube-scheduler "$sched" --kubeconfig "$STATE/scheduler.kubeconfig" \
    --authentication-kubeconfig "$STATE/scheduler.kubeconfig" --authorization-kubeconfig "$STATE/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$SCHEDULER_PORT" --cert-dir "$STATE/scheduler-certs" --leader-elect=false --profiling=false
  wait_for kube-controller-manager 120 curl -fsSk "https://127.0.0.1:$CM_PORT/healthz"
  wait_for kube-scheduler 120 curl -fsSk "https://127.0.0.1:$SCHEDULER_PORT/healthz"
  if [[ $registry != none ]]; then
    wait_for registry 30 curl -fsS "http://127.0.0.1:$REGISTRY_PORT/v2/"
  fi
  # The default ServiceAccount is what pods are admitted with: wait for its controller.
  wait_for kube-controller-manager 120 kubectl --kubeconfig "$STATE/admin.kubeconfig" -n default get serviceaccount default
  trap - EXIT
  note "control plane up in $((SECONDS - t0)) s: $("$apiserver" --version); KUBECONFIG=$STATE/admin.kubeconfig"
}

case $cmd in
  up) up ;;
  env) echo "export KUBECONFIG=$STATE/admin.kubeconfig" ;;
  down)
    stop
    find "$STATE" -mindepth 1 -maxdepth 1 ! -name log -exec rm -rf {} +
    ;;
  *) die "usage: $0 up|env|down STATE" ;;
esac
