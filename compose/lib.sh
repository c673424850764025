# Shared by compose/demo.sh and compose/swarm-demo.sh (sourced, not run).
#
# Output: human lines go to stdout, or to stderr with --json (then the last
# line of stdout is the JSON summary, as with every dqoes command).

# shellcheck shell=bash

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"

json=0
say() { printf '\n== %s (%s)\n' "$*" "$(date +%T)"; }
die() { echo "$(basename "$0"): $*" >&2; exit 1; }

# `--json`: keep fd 3 for the final JSON, send everything else to stderr.
json_mode() { json=1; exec 3>&1 1>&2; }
# A trap can fire inside a command whose stdout is redirected (to a file);
# the teardown then puts stdout back where it was after the options.
save_stdout() { exec 4>&1; }
restore_stdout() { exec 1>&4; }
emit_json() { if [ "$json" = 1 ]; then cat >&3; else cat >/dev/null; fi; }

need_engine() {
    docker info >/dev/null 2>&1 || die "no Docker engine (run: bash .ci/install-docker.sh)"
}

# Build the images when missing (or always with --build); never with --no-build.
ensure_images() {  # ensure_images auto|always|never
    if [ "$1" = always ]; then
        say "building the images (compose/images/build.sh)"
        bash "$here/images/build.sh"
    elif ! docker image inspect dqoes:latest dqoes-workload:latest >/dev/null 2>&1; then
        [ "$1" = never ] && die "image dqoes:latest or dqoes-workload:latest missing (make images)"
        say "images missing: building them (compose/images/build.sh, a few minutes the first time)"
        bash "$here/images/build.sh"
    fi
}

# A Python for compose/progress.py (standard library only).
py=python3
[ -x "$repo/.venv/bin/python" ] && py="$repo/.venv/bin/python"
progress() { "$py" "$here/progress.py" "$@"; }

# Credentials (docs/guide/security.md): made once per deployment name, kept outside the
# repository ($DQOES_AUTH_DIR, else ~/.local/state/dqoes/NAME/auth), for the given
# nodes. Exports DQOES_AUTH_DIR (the compose files mount from it) and
# DQOES_NATS_CREDS (the client's: what the dqoes CLI on this host speaks as).
ensure_credentials() {  # ensure_credentials NAME NODE...
    local name="$1" n args=()
    shift
    DQOES_AUTH_DIR="${DQOES_AUTH_DIR:-${XDG_STATE_HOME:-$HOME/.local/state}/dqoes/$name/auth}"
    for n in "$@"; do args+=(--node "$n"); done
    PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" "$py" -m shared.auth init --dir "$DQOES_AUTH_DIR" "${args[@]}" >/dev/null \
        || die "could not create the credentials in $DQOES_AUTH_DIR"
    export DQOES_AUTH_DIR DQOES_NATS_CREDS="$DQOES_AUTH_DIR/client.creds"
    echo "credentials: $DQOES_AUTH_DIR"
}

wait_for() {  # wait_for SECONDS WHAT COMMAND...: until COMMAND succeeds
    local limit="$1" what="$2" t0=$SECONDS
    shift 2
    until "$@"; do
        [ $((SECONDS - t0)) -ge "$limit" ] && die "$what: not after $limit s"
        sleep 2
    done
    echo "$what (after $((SECONDS - t0)) s)"
}

# One field of a JSON object on stdin (path a.b), or nothing.
json_field() {
    "$py" -c '
import json, sys
try:
    v = json.loads(sys.stdin.read().strip().splitlines()[-1])
    for k in sys.argv[1].split("."):
        v = v[k]
    print(v)
except Exception:
    pass' "$1"
}

# CPU limit in force of containers, as docker inspect shows it:
# NAME CORES(or none) MODE CPUSET
limits_table() {  # limits_table CONTAINER...
    [ $# -gt 0 ] || return 0
    # '|' between fields: an empty one (no cpuset, no label) must not shift the others.
    docker inspect -f '{{.Name}}|{{.HostConfig.NanoCpus}}|{{.HostConfig.CpuQuota}}|{{.HostConfig.CpuPeriod}}|{{.HostConfig.CpusetCpus}}|{{index .Config.Labels "dqoes.model"}}|{{index .Config.Labels "dqoes.node"}}' "$@" \
        | awk -F'|' '{
            for (i = 5; i <= 7; i++) if ($i == "<no value>") $i = ""
            name = substr($1, 2)
            if ($2 > 0)      { lim = sprintf("%.3f", $2 / 1e9); mode = "NanoCpus" }
            else if ($3 > 0) { lim = sprintf("%.3f", $3 / ($4 > 0 ? $4 : 100000)); mode = "CpuQuota" }
            else             { lim = "none"; mode = "-" }
            printf "%s %s %s %s %s %s\n", name, lim, mode, ($5 == "" ? "all" : $5), ($6 == "" ? "-" : $6), ($7 == "" ? "-" : $7)
        }' | sort
}

print_limits() {  # print_limits OBJECTIVES_FILE CONTAINER...: a table of what the worker set
    local objectives="$1"
    shift
    printf '  %-44s %-12s %-8s %-9s %-10s %s\n' container model node objective "limit" "(docker inspect)"
    limits_table "$@" | while read -r name lim mode cpuset model node; do
        local o
        o="$(awk -v n="$name" '$1 == n { o = $2 } END { print o }' "$objectives")"  # a target overrides a label
        printf '  %-44s %-12s %-8s %-9s %-10s %s\n' "$name" "$model" "$node" "${o:--}${o:+ s}" \
            "$([ "$lim" = none ] && echo none || echo "$lim cpu")" "$mode, cpuset $cpuset"
    done
}

# {"container": cores or null, ...} for the JSON summary.
limits_json() {
    limits_table "$@" | "$py" -c '
import json, sys
out = {}
for row in sys.stdin:
    name, lim = row.split()[:2]
    out[name] = None if lim == "none" else float(lim)
print(json.dumps(out))'
}

# `progress.py latencies` needs this project's `shared` package: the repo's
# venv, else the dqoes:latest image (the script on stdin). Extra docker run
# options (e.g. --network host) come before "--".
progress_nats() {  # progress_nats [DOCKER_RUN_OPTS... --] ARGS...
    local opts=()
    if [[ " $* " == *" -- "* ]]; then
        while [ "$1" != -- ]; do opts+=("$1"); shift; done
        shift
    fi
    if [ -x "$repo/.venv/bin/python" ]; then
        "$repo/.venv/bin/python" "$here/progress.py" "$@"
    else
        docker run --rm -i "${opts[@]}" -e DQOES_NATS_CREDS -v "$DQOES_AUTH_DIR:$DQOES_AUTH_DIR:ro" \
            dqoes:latest python - "$@" <"$here/progress.py"
    fi
}

# Objectives from "service=seconds" or "service=xF" (F times the container's
# median at fair share, from a `progress.py latencies` JSON file).
# Prints "container seconds how" a line. NAME_FN maps a service to its container.
resolve_targets() {  # resolve_targets TARGETS BASELINE_JSON NAME_FN
    local targets="$1" baseline="$2" fn="$3" t svc spec name host
    for t in $targets; do
        svc="${t%%=*}"
        spec="${t#*=}"
        name="$("$fn" "$svc")"
        [ -n "$name" ] || die "objectives: no running container for service $svc"
        host="$(docker inspect -f '{{.Config.Hostname}}' "$name")"
        "$py" - "$baseline" "$name" "$host" "$spec" <<'PY' || die "objectives: cannot resolve $t"
import json, sys
path, name, host, spec = sys.argv[1:5]
try:
    base = json.load(open(path))
except (OSError, ValueError):
    base = {}
if spec.startswith("x"):
    b = base.get(host) or base.get(name)
    if not b:
        sys.exit(f"no fair-share latency measured for {name}")
    print(name, round(float(spec[1:]) * b["median_s"], 2), f"{spec[1:]} x its {b['median_s']:.2f} s at fair share")
else:
    print(name, round(float(spec), 2), "fixed")
PY
    done
}

baseline_of() {  # baseline_of BASELINE_JSON HOSTNAME: "N.NN s a batch (median of K)"
    "$py" - "$1" "$2" <<'PY'
import json, sys
b = json.load(open(sys.argv[1])).get(sys.argv[2])
print(f"{b['median_s']:.2f} s a batch (median of {b['batches']} batches)" if b else "-")
PY
}
