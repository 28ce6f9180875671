# shellcheck shell=bash
# Sourced by hack/lanes.sh and hack/crio-binaries.sh: a tag's or branch's tree out of a git
# directory that may be a partial clone or mirror.

# git_export GIT REF DIR WHO: REF's tree into DIR (created). GIT is a clone or a bare git dir. A
# partial clone or mirror may lack a few blobs none of the builds reads (release-4.19's microshift
# mirror: the openapi swagger.json test data of staging cli-runtime and kubectl; cri-o's:
# go-sqlite3's amalgamation): those paths are left out rather than failing the export, and WHO
# says how many on stderr; git archive may still print "error: invalid object" for one of them
# and exit 0. Submodules are exported as empty directories. Returns 1 when GIT has no REF.
git_export() {
  local git=$1 ref=$2 dir=$3 who=$4 gd absent path
  gd=$(git -C "$git" rev-parse --git-dir 2>/dev/null) || gd=$git
  [[ $gd == /* ]] || gd=$git/$gd
  git --git-dir="$gd" rev-parse --verify -q "$ref^{tree}" >/dev/null || return 1
  local excludes=()
  absent=$(git --git-dir="$gd" ls-tree -r "$ref" | awk '$2 == "blob" { print $3 }' |
    git --git-dir="$gd" cat-file --batch-check 2>/dev/null | awk '$2 == "missing" { print $1 }')
  while IFS= read -r path; do
    [[ -z $path ]] || excludes+=(":(exclude)$path")
  done < <(git --git-dir="$gd" ls-tree -r "$ref" |
    awk -v absent="$absent" 'BEGIN { n = split(absent, a, "\n"); for (i = 1; i <= n; i++) m[a[i]] = 1 }
      $3 in m { sub(/^[^\t]*\t/, ""); print }')
  [[ ${#excludes[@]} -eq 0 ]] || echo "$who: ${#excludes[@]} blob(s) absent from $git, left out of the export (git archive may still name them: \"invalid object\")" >&2
  mkdir -p "$dir"
  git --git-dir="$gd" archive "$ref" -- . "${excludes[@]}" | tar -x -C "$dir"
}
