#!/usr/bin/env bash
# The compose cluster demo (`make compose-demo`): bring up compose/docker-compose.yml,
# set objectives through dqoes.targets, print the satisfied count as it evolves,
# print a summary and tear everything down (also on Ctrl-C or an error).
# See docs/guide/compose.md.
set -euo pipefail
# shellcheck source=compose/lib.sh
source "$(cd "$(dirname "$0")" && pwd)/lib.sh"
compose_file="$here/docker-compose.yml"
# Per node: one tight (needs more than a fair third of the core), one loose,
# one a little looser than fair share. xF: F times the container's own
# median seconds a batch measured at fair share just before.
default_targets="a1=x0.75 a2=x1.5 a3=x1.15 b1=x1.15 b2=x0.75 b3=x1.5"

usage() {
    cat <<USAGE
usage: compose/demo.sh [options]

Run the DQoES compose demo: NATS (JetStream), the manager, one worker for each
of two logical nodes (node-a = CPU 0, node-b = CPU 1) and six inference
containers (ResNet-50, MobileNetV2, VGG-16, Inception-v3, Xception at small
resolutions). First each container's seconds a batch is measured at Docker's
fair share (no objectives, no limits); then objectives relative to those are
set through dqoes.targets (dqoes target set): per node one tight, one loose,
one near fair share. The satisfied count is printed as it evolves, then a
summary; everything is torn down at the end (docker-compose down -v), also on
Ctrl-C or an error.

options:
  --policy P       learned (default, the recommended allocator), dqoes (the paper's
                   algorithm), default (no limits: Docker's fair share), or several
                   separated by commas, each on a fresh deployment with the first run's
                   objectives, then every summary (all: default,dqoes,learned;
                   both: dqoes,default)
  --duration S     seconds to watch after the objectives are set (default 150)
  --every S        one progress line every S seconds (default 10)
  --window S       the summary's final window, seconds (default 60)
  --interval S     the workers' initial control interval (default 5)
  --baseline S     seconds to measure the fair-share latencies (default 30)
  --alpha A        the objectives' tolerance band (default: the workers', 0.10)
  --port N         host port for NATS, bound to 127.0.0.1 (default 14222)
  --project NAME   compose project name (default dqoes-demo)
  --build          rebuild the images first (after code changes)
  --no-build       never build; fail if an image is missing
  --keep           leave the deployment running (one policy only); tear down with
                   docker-compose -f compose/docker-compose.yml -p NAME down -v
  --json           progress on stderr; the last line of stdout is the JSON summary
  -h, --help       show this help

env:
  DQOES_DEMO_TARGETS   objectives to set, "service=seconds" or "service=xF" (F times
                       its fair-share median) ... (default: "$default_targets")
  DQOES_A1_OBJECTIVE, DQOES_B1_OBJECTIVE
                       objectives for a1's and b1's dqoes.objective_s labels (default:
                       none; a target set through dqoes.targets overrides a label)
  COMPOSE              the compose command (default: "docker compose" if the v2
                       plugin is installed, else docker-compose)
  DQOES_CLI            the dqoes command (default: .venv/bin/dqoes, dqoes on PATH,
                       else the dqoes:latest image with --network host)
USAGE
}

policy=learned
duration=150
every=10
window=60
interval=5
baseline=30
alpha=""
port=14222
project=dqoes-demo
build=auto
keep=0
while [ $# -gt 0 ]; do
    case "$1" in
        --policy) policy="${2:?--policy needs a value}"; shift ;;
        --duration) duration="${2:?--duration needs a value}"; shift ;;
        --every) every="${2:?--every needs a value}"; shift ;;
        --window) window="${2:?--window needs a value}"; shift ;;
        --interval) interval="${2:?--interval needs a value}"; shift ;;
        --baseline) baseline="${2:?--baseline needs a value}"; shift ;;
        --alpha) alpha="${2:?--alpha needs a value}"; shift ;;
        --port) port="${2:?--port needs a value}"; shift ;;
        --project) project="${2:?--project needs a value}"; shift ;;
        --build) build=always ;;
        --no-build) build=never ;;
        --keep) keep=1 ;;
        --json) json_mode ;;
        -h|--help) usage; exit 0 ;;
        *) echo "demo.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
case "$policy" in all) policy=default,dqoes,learned ;; both) policy=dqoes,default ;; esac
IFS=, read -r -a policies <<<"$policy"
for p in "${policies[@]}"; do
    case "$p" in learned|dqoes|default) ;; *) echo "demo.sh: --policy must be learned, dqoes, default, a list of them separated by commas, all or both" >&2; exit 2 ;; esac
done
for v in "$duration" "$every" "$window" "$interval" "$baseline" "$port"; do
    if ! [[ "$v" =~ ^[0-9]+$ ]] || [ "$v" -eq 0 ]; then
        echo "demo.sh: '$v' is not a positive whole number" >&2; exit 2
    fi
done
[ "${#policies[@]}" -gt 1 ] && [ "$keep" = 1 ] && { echo "demo.sh: --keep needs one policy" >&2; exit 2; }
targets="${DQOES_DEMO_TARGETS:-$default_targets}"
url="nats://127.0.0.1:$port"
export DQOES_DEMO_PORT="$port" DQOES_INTERVAL_S="$interval"

# ---- tools --------------------------------------------------------------------
need_engine
if [ -n "${COMPOSE:-}" ]; then
    read -r -a compose_cmd <<<"$COMPOSE"
elif docker compose version >/dev/null 2>&1; then
    compose_cmd=(docker compose)
elif command -v docker-compose >/dev/null 2>&1; then
    compose_cmd=(docker-compose)
else
    die "neither 'docker compose' (v2) nor docker-compose (v1) is installed (Debian: apt-get install -y docker-compose)"
fi
compose() { "${compose_cmd[@]}" -f "$compose_file" -p "$project" "$@"; }
compose_version="${compose_cmd[*]} $("${compose_cmd[@]}" version --short 2>/dev/null || echo '?')"

ensure_images "$build"
ensure_credentials "compose-$project" "${DQOES_NODE_A:-node-a}" "${DQOES_NODE_B:-node-b}"

if [ -n "${DQOES_CLI:-}" ]; then
    read -r -a cli <<<"$DQOES_CLI"
elif [ -x "$repo/.venv/bin/dqoes" ]; then
    cli=("$repo/.venv/bin/dqoes")
elif command -v dqoes >/dev/null 2>&1; then
    cli=(dqoes)
else  # the control-plane image has the CLI; host networking reaches 127.0.0.1:$port
    cli=(docker run --rm -i --network host -e DQOES_NATS_CREDS -v "$DQOES_AUTH_DIR:$DQOES_AUTH_DIR:ro" dqoes:latest dqoes)
fi
dqoes() { "${cli[@]}" "$@"; }
echo "compose: $compose_version   project: $project   NATS: $url   cli: ${cli[*]}"

# ---- teardown, whatever happens -----------------------------------------------------
save_stdout
work="$(mktemp -d "${TMPDIR:-/tmp}/dqoes-demo.XXXXXX")"
up=0
leftovers() {  # what of the project still exists: "container|network|volume NAME" lines
    local f="label=com.docker.compose.project=$project"
    docker ps -a --filter "$f" --format 'container {{.Names}}'
    docker network ls --filter "$f" --format 'network {{.Name}}'
    docker volume ls --filter "$f" --format 'volume {{.Name}}'
}
down() {  # tear the project down completely, or say loudly what is left and return 1
    say "tearing down (project $project)"
    # Workers first, so nothing re-limits a container while it stops.
    compose stop -t 5 worker-a worker-b >/dev/null 2>&1 || true
    local out
    if ! out="$(compose down -v --remove-orphans -t 10 2>&1)"; then
        echo "demo.sh: '${compose_cmd[*]} down' failed:" >&2
        echo "$out" | sed 's/^/    /' >&2
        # "network ... has active endpoints": a container still attached (stopping, or
        # not the project's). Force the project's containers out, detach whatever else
        # holds its networks, then remove what is left by name.
        local kind name ids
        ids="$(docker ps -aq --filter "label=com.docker.compose.project=$project")"
        if [ -n "$ids" ]; then docker rm -f $ids >/dev/null || true; fi
        while read -r kind name; do
            case "$kind" in
                network)
                    for ids in $(docker network inspect -f '{{range $id, $c := .Containers}}{{$id}} {{end}}' "$name" 2>/dev/null); do
                        docker network disconnect -f "$name" "$ids" >/dev/null 2>&1 || true
                    done
                    docker network rm "$name" >/dev/null || true ;;
                volume) docker volume rm -f "$name" >/dev/null || true ;;
            esac
        done < <(leftovers)
    else
        echo "$out" | grep -v -e '^Stopping' -e '^Removing' -e '^Network' -e '^ *Container' -e '^ *Network' -e '^ *Volume' || true
    fi
    local left
    left="$(leftovers)"
    if [ -n "$left" ]; then
        echo "demo.sh: TEARDOWN FAILED: project $project left these behind:" >&2
        echo "$left" | sed 's/^/    /' >&2
        echo "demo.sh: remove them by hand (docker rm -f / docker network rm / docker volume rm) before the next run" >&2
        return 1
    fi
    up=0
}
teardown() {
    local status=$?
    trap - EXIT INT TERM
    restore_stdout
    if [ "$up" = 1 ]; then
        if [ "$status" != 0 ] && [ "$status" != 130 ]; then
            echo "demo.sh: failed (status $status); the last lines of each service's log:" >&2
            compose logs --no-color --tail=6 2>&1 | sed 's/^/    /' >&2 || true
        fi
        if [ "$keep" = 1 ] && [ "$status" = 0 ]; then
            echo "left running (--keep): ${compose_cmd[*]} -f $compose_file -p $project down -v"
        elif ! down && [ "$status" = 0 ]; then
            status=1  # a teardown that left something behind fails the demo
        fi
    fi
    rm -rf "$work"
    exit "$status"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- helpers ------------------------------------------------------------------------
managed_ids() {
    docker ps -q --filter "label=com.docker.compose.project=$project" --filter label=dqoes.managed=true
}
container_of() {  # the running container of a compose service
    docker ps --filter "label=com.docker.compose.project=$project" \
        --filter "label=com.docker.compose.service=$1" --format '{{.Names}}' | head -n 1
}
manager_answers() { dqoes status --nats "$url" --json >/dev/null 2>&1; }
n_inference=0
all_containers_seen() {
    [ "$(dqoes status --nats "$url" --json 2>/dev/null | json_field containers_total)" = "$n_inference" ]
}

# ---- one run ------------------------------------------------------------------------
json_runs=()
fixed_targets=""
run_once() {
    local pol="$1"
    local log="$work/samples-$pol.jsonl" objectives="$work/objectives-$pol.txt"
    say "up: policy $pol"
    # A clean store: objectives an earlier run left in its NATS volume would be in force
    # during the fair-share baseline. Whatever is left of the project goes first, or the
    # demo stops here.
    if [ -n "$(leftovers)" ]; then
        echo "an earlier run of project $project left containers, networks or volumes: removing them"
        down || die "cannot start from a clean store (see above)"
    fi
    up=1
    DQOES_POLICY="$pol" compose up -d 2>&1 | grep -v -e '^Creating' -e '^Starting' -e 'is up-to-date' || true
    n_inference=$(managed_ids | wc -l)
    [ "$n_inference" -gt 0 ] || die "no inference container is running"
    wait_for 120 "the manager answers on $url" manager_answers
    wait_for 120 "the workers report all $n_inference inference containers" all_containers_seen
    local stored
    stored="$(dqoes target list --nats "$url" --json 2>/dev/null | json_field targets)"
    [ -n "$stored" ] || die "cannot read the stored objectives (an image older than this CLI? rerun with --build)"
    [ "$stored" = "[]" ] || die "the objective store is not empty at start: $stored"
    echo "objective store: empty (a fresh JetStream volume)"

    local id name o
    : >"$objectives"
    for id in $(managed_ids); do  # objectives from labels, if any were given
        read -r name o < <(docker inspect -f '{{.Name}} {{index .Config.Labels "dqoes.objective_s"}}' "$id")
        if [ -n "$o" ]; then echo "${name#/} $o" >>"$objectives"; fi
    done

    local use_targets="$targets" base="$work/baseline.json"
    if [ -n "$fixed_targets" ]; then
        use_targets="$fixed_targets"  # a later run of several policies: the first run's objectives
    elif [[ "$targets" == *=x* ]]; then
        say "fair share: each container's seconds a batch with no objectives and no limits (${baseline} s)"
        progress_nats --network host -- latencies --nats "$url" --containers "$n_inference" \
            --seconds "$baseline" >"$base" || die "no batches from every inference container (see the logs below)"
        local h
        for id in $(managed_ids); do
            read -r name h o < <(docker inspect -f '{{.Name}} {{.Config.Hostname}} {{index .Config.Labels "dqoes.model"}}' "$id")
            printf '  %-28s %-12s %s\n' "${name#/}" "$o" "$(baseline_of "$base" "$h")"
        done | sort
    fi

    say "objectives through dqoes.targets"
    local t svc line secs how
    fixed_targets=""
    for t in $use_targets; do
        svc="${t%%=*}"
        line="$(resolve_targets "$t" "$base" container_of)"
        read -r name secs how <<<"$line"
        [ "$use_targets" = "$targets" ] || how="the same objective as the first run"
        fixed_targets+="$svc=$secs "
        echo "\$ dqoes target set $name $secs${alpha:+ --alpha $alpha}     # $how"
        dqoes target set "$name" "$secs" ${alpha:+--alpha "$alpha"} --nats "$url" | sed 's/^/    /'
        echo "$name $secs" >>"$objectives"
    done
    local t0
    t0="$(date +%s.%N)"

    say "watching for $duration s: satisfied = the last batch within +-${alpha:-0.10} x its objective"
    dqoes watch --nats "$url" --json --every "$every" --count $((duration / every)) \
        | progress follow --log "$log" --t0 "$t0" \
        || die "no cluster state arrived on dqoes.cluster.state"

    say "final state (policy $pol)"
    dqoes status --nats "$url"
    echo
    echo "CPU limits in force:"
    # shellcheck disable=SC2046
    print_limits "$objectives" $(managed_ids)
    echo
    # shellcheck disable=SC2046
    printf '{"compose": "%s", "project": "%s", "objectives": %s, "limits_final_cpus": %s}\n' \
        "$compose_version" "$project" \
        "$("$py" -c 'import json,sys; print(json.dumps({l.split()[0]: float(l.split()[1]) for l in open(sys.argv[1]) if l.strip()}))' "$objectives")" \
        "$(limits_json $(managed_ids))" >"$work/extra-$pol.json"
    progress summary --log "$log" --window "$window" --label "$pol" || true
    json_runs+=("$(progress summary --log "$log" --window "$window" --label "$pol" --extra "$work/extra-$pol.json" --json)")
    if [ "$keep" = 0 ]; then
        down
    fi
}

for p in "${policies[@]}"; do run_once "$p"; done

if [ "${#json_runs[@]}" -gt 1 ]; then
    say "comparison"
    for p in "${policies[@]}"; do
        progress summary --log "$work/samples-$p.jsonl" --window "$window" --label "$p" || true
    done
fi
printf '%s\n' "${json_runs[@]}" | "$py" -c '
import json, sys
runs = [json.loads(l) for l in sys.stdin if l.strip()]
print(json.dumps(runs[0] if len(runs) == 1 else {"runs": {r["policy"]: r for r in runs}}))' | emit_json
