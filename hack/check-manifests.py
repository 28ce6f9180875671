#!/usr/bin/python3
"""Validates crisp's Kubernetes manifests offline (no API server):

    hack/check-manifests.py [--patch] [FILE...]   default: deploy/ (base, overlay, renderings)
    hack/check-manifests.py --deploy DIR          a release's deploy/ tree (hack/release.sh
                                                  writes DIST/deploy): images pinned by digest

1. Schema: every field of every object, at every depth, is checked against the Kubernetes API
   models of Debian's python3-kubernetes (API 1.22): a misspelt or misplaced key, a wrong type
   or a missing required field fails. Fields added after 1.22 would be reported as unknown.
   A strategic-merge patch (a file whose objects lack required fields) is checked for names and
   types only (--patch FILE).
2. The installer DaemonSet's rules (docs/DEPLOY.md "Install on a cluster", SECURITY.md "The
   installer DaemonSet"): no hostPID, hostNetwork, hostIPC or shareProcessNamespace,
   automountServiceAccountToken: false, seccompProfile RuntimeDefault; the install runs once, as
   the privileged init container `installer` (the node's / with HostToContainer propagation,
   through which it reaches PID 1; CRISP_MODE); the container that stays is unprivileged (no
   privilege escalation, every capability dropped, a uid and gid of its own (not 65534),
   read-only root, no host path) and carries the readiness probe; node-label opt-in,
   one node at a time. Every image is pinned by digest (NAME[:TAG]@sha256:64 hex digits) in a
   manifest given as FILE and in a release's tree (--deploy); the source tree's base names the
   image by tag (hack/release.sh pins it), which is reported.
3. When kubectl is on PATH, `kubectl kustomize` renders deploy/base and deploy/uninstall, each
   rendering passes 1 and 2, and they differ only in CRISP_MODE. Without kubectl that step is
   reported as not run.

Exit code 0 when everything checked passed.
"""
import datetime
import os
import re
import shutil
import subprocess
import sys

import yaml
from kubernetes import client

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = {
    ("v1", "Namespace"): "V1Namespace",
    ("apps/v1", "DaemonSet"): "V1DaemonSet",
}
PRIMITIVE = {"str": str, "int": int, "bool": bool, "float": (int, float), "object": object}

errors = []


def err(where, msg):
    errors.append(f"{where}: {msg}")


def model(name):
    return getattr(client, name)


def required_fields(cls):
    """Fields whose setter refuses None (the generated models raise ValueError for those)."""
    req = []
    for attr in cls.openapi_types:
        obj = cls.__new__(cls)
        obj.local_vars_configuration = client.Configuration()
        obj.local_vars_configuration.client_side_validation = True
        try:
            setattr(obj, attr, None)
        except ValueError:
            req.append(attr)
        except Exception:  # noqa: BLE001 - other setters' checks are not about presence
            pass
    return req


def check(value, typ, where, partial):
    if value is None:
        return
    m = re.fullmatch(r"list\[(.*)\]", typ)
    if m:
        if not isinstance(value, list):
            return err(where, f"expected a list ({typ}), got {type(value).__name__}")
        for i, v in enumerate(value):
            check(v, m.group(1), f"{where}[{i}]", partial)
        return
    m = re.fullmatch(r"dict\(str, (.*)\)", typ)
    if m:
        if not isinstance(value, dict):
            return err(where, f"expected a map ({typ}), got {type(value).__name__}")
        for k, v in value.items():
            check(v, m.group(1), f"{where}.{k}", partial)
        return
    if typ in PRIMITIVE:
        if typ == "str" and isinstance(value, (int, float)) and not isinstance(value, bool):
            return err(where, f"expected a string, got the number {value!r} (quote it)")
        if not isinstance(value, PRIMITIVE[typ]) or (typ == "int" and isinstance(value, bool)):
            err(where, f"expected {typ}, got {type(value).__name__} {value!r}")
        return
    if typ == "datetime":
        if not isinstance(value, (str, datetime.datetime)):
            err(where, f"expected a timestamp, got {value!r}")
        return
    cls = model(typ)
    if not isinstance(value, dict):
        return err(where, f"expected an object ({typ}), got {type(value).__name__} {value!r}")
    # IntOrString fields are typed "object" in these models; handled by PRIMITIVE above.
    by_json = {j: a for a, j in cls.attribute_map.items()}
    for k, v in value.items():
        if k not in by_json:
            err(where, f"unknown field '{k}' for {typ} (fields: {', '.join(sorted(by_json))})")
            continue
        check(v, cls.openapi_types[by_json[k]], f"{where}.{k}", partial)
    if not partial:
        for a in required_fields(cls):
            if cls.attribute_map[a] not in value:
                err(where, f"missing required field '{cls.attribute_map[a]}' of {typ}")


def check_object(obj, where, partial=False):
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key not in KINDS:
        return err(where, f"unexpected object {key}")
    check(obj, KINDS[key], f"{where} {key[1]}/{obj.get('metadata', {}).get('name')}", partial)


PINNED = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")


def installer_rules(objs, where, mode, pinned=True):
    try:
        _installer_rules(objs, where, mode, pinned)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        # Malformed beyond what the rules can read: the schema errors say why.
        err(where, f"the installer rules cannot read this DaemonSet ({type(e).__name__}: {e})")


def _installer_rules(objs, where, mode, pinned):
    ds = [o for o in objs if o.get("kind") == "DaemonSet"]
    if len(ds) != 1:
        return err(where, f"expected one DaemonSet, got {len(ds)}")
    d = ds[0]
    ns = [o for o in objs if o.get("kind") == "Namespace"]
    if not ns or ns[0]["metadata"]["name"] != d["metadata"]["namespace"]:
        err(where, "the DaemonSet's namespace is not created alongside it")
    elif ns[0]["metadata"].get("labels", {}).get("pod-security.kubernetes.io/enforce") != "privileged":
        err(where, "the namespace must allow privileged pods (pod-security.kubernetes.io/enforce: privileged)")
    spec = d["spec"]
    ru = spec.get("updateStrategy", {})
    if ru.get("type") != "RollingUpdate" or ru.get("rollingUpdate", {}).get("maxUnavailable") != 1:
        err(where, "updateStrategy must be RollingUpdate with maxUnavailable: 1 (node by node)")
    if ru.get("rollingUpdate", {}).get("maxSurge", 0) != 0:
        err(where, "maxSurge must be 0: two installers on one node would race")
    tpl = spec["template"]
    if spec["selector"]["matchLabels"].items() - tpl["metadata"]["labels"].items():
        err(where, "the selector does not match the pod template's labels")
    pod = tpl["spec"]
    if pod.get("nodeSelector") != {"crisp.dev/install": "true"}:
        err(where, "nodeSelector must be the opt-in label crisp.dev/install: \"true\"")
    # Every pod-level field SECURITY.md ("The installer DaemonSet") names (issue #44): the pod
    # shares nothing of the node's but the init container's host mount.
    for field, why in (
        ("hostPID", "the installer reaches the node's systemd over its D-Bus system bus, from the pod's own PID namespace; a node without one needs an operator's own patch (docs/DEPLOY.md, \"hostPID\")"),
        ("hostNetwork", "nothing in the installer uses the node's network"),
        ("hostIPC", "nothing in the installer uses the node's IPC"),
        ("shareProcessNamespace", "the reporter must not see (or signal) the installer's processes"),
    ):
        if pod.get(field):
            err(where, f"{field} must not be set: {why} (SECURITY.md)")
    if pod.get("automountServiceAccountToken") is not False:
        err(where, "automountServiceAccountToken: false is required: the installer talks to no API server (SECURITY.md)")
    if pod.get("securityContext", {}).get("seccompProfile", {}).get("type") != "RuntimeDefault":
        err(where, "the pod's securityContext.seccompProfile must be RuntimeDefault (SECURITY.md)")
    inits = pod.get("initContainers", [])
    containers = pod.get("containers", [])
    for k in inits + containers:
        image = k.get("image", "")
        if pinned and not PINNED.match(image):
            err(where, f"container {k.get('name')}: image {image!r} is not pinned by digest (NAME@sha256:<64 hex>; hack/release.sh writes the pinned overlay)")
    if [k.get("name") for k in inits] != ["installer"]:
        return err(where, "the install must run as one init container named installer")
    (c,) = inits
    if c.get("args") != ["once"]:
        err(where, f"the installer init container must run the entrypoint's `once` (record and exit), got args {c.get('args')}")
    if c.get("securityContext", {}).get("privileged") is not True:
        err(where, "the installer init container must be privileged")
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    for k in containers:
        sc = k.get("securityContext", {})
        name = k.get("name")
        if sc.get("privileged") is not False or sc.get("allowPrivilegeEscalation") is not False:
            err(where, f"container {name} stays running: it must not be privileged (privileged: false, allowPrivilegeEscalation: false)")
        if sc.get("capabilities", {}).get("drop") != ["ALL"] or sc.get("capabilities", {}).get("add"):
            err(where, f"container {name} stays running: it must drop every capability (capabilities: drop: [ALL])")
        if sc.get("runAsNonRoot") is not True or not sc.get("runAsUser"):
            err(where, f"container {name} stays running: it must run as a non-root user (runAsNonRoot, runAsUser)")
        elif sc.get("runAsUser") == 65534 or sc.get("runAsGroup") in (None, 0, 65534):
            err(where, f"container {name} stays running: it must run as a uid and gid of its own (not nobody/65534, which charts share; runAsUser, runAsGroup)")
        if sc.get("seccompProfile", {"type": "RuntimeDefault"}).get("type") != "RuntimeDefault":
            err(where, f"container {name} stays running: seccompProfile must stay RuntimeDefault")
        if sc.get("readOnlyRootFilesystem") is not True:
            err(where, f"container {name} stays running: readOnlyRootFilesystem: true")
        for m in k.get("volumeMounts", []):
            if "hostPath" in vols.get(m["name"], {}):
                err(where, f"container {name} stays running: it must mount no host path, got {m['mountPath']}")
    if len(containers) != 1:
        return err(where, f"expected one container that stays (the reporter), got {len(containers)}")
    (r,) = containers
    mounts = [m for m in c.get("volumeMounts", []) if m["mountPath"] == "/host"]
    if len(mounts) != 1 or vols.get(mounts[0]["name"], {}).get("hostPath", {}).get("path") != "/":
        err(where, "the node's / must be mounted at /host (hostPath /)")
    elif mounts[0].get("mountPropagation") != "HostToContainer":
        err(where, "/host needs mountPropagation: HostToContainer (the node's /run is a submount)")
    probe = r.get("readinessProbe", {}).get("exec", {}).get("command")
    if probe != ["/opt/crisp/entrypoint.sh", "reported"]:
        err(where, f"the reporter's readinessProbe must run the entrypoint's reported check, got {probe}")
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    if env.get("CRISP_MODE") != mode:
        err(where, f"CRISP_MODE is {env.get('CRISP_MODE')!r}, expected {mode!r}")
    if pod.get("terminationGracePeriodSeconds", 30) < 60:
        err(where, "terminationGracePeriodSeconds must leave an install (kubelet's restart) time to finish")
    if not any(t.get("operator") == "Exists" and "key" not in t for t in pod.get("tolerations", [])):
        err(where, "the installer must tolerate every taint (NotReady nodes need it most)")


def load(path):
    with open(path) as f:
        return [o for o in yaml.safe_load_all(f) if o]


def main(argv):
    checked = []
    deploy = None
    if "--deploy" in argv:
        i = argv.index("--deploy")
        if i + 1 >= len(argv):
            print("check-manifests: error: --deploy needs a directory", file=sys.stderr)
            return 2
        deploy = os.path.abspath(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    files = [a for a in argv if a != "--patch"]
    patch = "--patch" in argv
    if not files:
        # The source tree names the image by tag; a release's tree must pin it.
        pinned = deploy is not None
        root = deploy or os.path.join(REPO, "deploy")
        base = os.path.join(root, "base/crisp-installer.yaml")
        objs = load(base)
        for i, o in enumerate(objs):
            check_object(o, f"{base}#{i}")
        installer_rules(objs, base, "install", pinned)
        checked.append(base)
        if not pinned:
            print("check-manifests: image pins not required of the source tree (hack/release.sh pins them in DIST/deploy: check it with --deploy DIR)")
        p = os.path.join(root, "uninstall/uninstall-mode.yaml")
        for i, o in enumerate(load(p)):
            check_object(o, f"{p}#{i}", partial=True)
        checked.append(p + " (patch)")
        kubectl = shutil.which("kubectl")
        if kubectl:
            rendered = {}
            for d, mode in (("deploy/base", "install"), ("deploy/uninstall", "uninstall")):
                r = subprocess.run([kubectl, "kustomize", os.path.join(root, d.split("/", 1)[1])], capture_output=True, text=True)
                if r.returncode != 0:
                    err(d, f"kubectl kustomize failed: {r.stderr.strip()}")
                    continue
                objs = [o for o in yaml.safe_load_all(r.stdout) if o]
                for i, o in enumerate(objs):
                    check_object(o, f"kustomize {d}#{i}")
                installer_rules(objs, f"kustomize {d}", mode, pinned)
                rendered[d] = r.stdout
                checked.append(f"kubectl kustomize {d}")
            if len(rendered) == 2:
                a, b = rendered["deploy/base"].splitlines(), rendered["deploy/uninstall"].splitlines()
                changed = [(x, y) for x, y in zip(a, b) if x != y]
                if len(a) != len(b) or [(x.strip(), y.strip()) for x, y in changed] != [("value: install", "value: uninstall")]:
                    err("deploy/uninstall", f"the overlay must change CRISP_MODE only, changed: {changed}")
        else:
            print("check-manifests: kustomize rendering NOT checked: no kubectl on PATH")
    else:
        for path in files:
            objs = load(path)
            for i, o in enumerate(objs):
                check_object(o, f"{path}#{i}", partial=patch)
            if not patch:
                installer_rules(objs, path, "install")
            checked.append(path)
    for c in checked:
        print(f"check-manifests: checked {c}")
    for e in errors:
        print(f"check-manifests: error: {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
