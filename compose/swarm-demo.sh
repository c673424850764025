#!/usr/bin/env bash
# The single-node Swarm demo (`make swarm-demo`): docker stack deploy of
# compose/stack.yml, objectives through dqoes.targets, the satisfied count as
# it evolves, the limits the worker set on the task containers, then
# `docker stack rm` (also on Ctrl-C or an error). A swarm this script
# initialised is left again at the end; one that was already active stays.
# See docs/guide/compose.md.
set -euo pipefail
# shellcheck source=compose/lib.sh
source "$(cd "$(dirname "$0")" && pwd)/lib.sh"
stack_file="$here/stack.yml"
# As in demo.sh: xF = F times the container's median at fair share, measured first.
default_targets="s1=x0.8 s2=x1.6 s3=x1.3 s4=x1.2"

usage() {
    cat <<USAGE
usage: compose/swarm-demo.sh [options]

Run DQoES as a Swarm stack on this one node: NATS (JetStream), the manager, a
worker (mode global: one a node) and four inference services. The worker
finds the task containers by their labels and updates their CPU limits
directly (docker update on the container; the service spec is not changed).
First each container's seconds a batch is measured at Docker's fair share;
then objectives relative to those are set through dqoes.targets.
Ends with docker stack rm; leaves the swarm only if this script created it.

options:
  --duration S     seconds to watch after the objectives are set (default 120)
  --every S        one progress line every S seconds (default 10)
  --window S       the summary's final window, seconds (default 60)
  --interval S     the worker's initial control interval (default 5)
  --baseline S     seconds to measure the fair-share latencies (default 30)
  --alpha A        the objectives' tolerance band (default: the worker's, 0.10)
  --stack NAME     stack name (default dqoes)
  --policy P       learned (default), dqoes (the paper's algorithm) or default (no limits)
  --build          rebuild the images first;  --no-build: fail if one is missing
  --json           progress on stderr; the last line of stdout is the JSON summary
  -h, --help       show this help

env:
  DQOES_SWARM_TARGETS  objectives to set, "service=seconds" or "service=xF" ...
                       (default "$default_targets")
  DQOES_S1_OBJECTIVE   an objective for s1's dqoes.objective_s label (default: none)
USAGE
}

duration=120
every=10
window=60
interval=5
baseline=30
alpha=""
stack=dqoes
policy=learned
build=auto
while [ $# -gt 0 ]; do
    case "$1" in
        --duration) duration="${2:?--duration needs a value}"; shift ;;
        --every) every="${2:?--every needs a value}"; shift ;;
        --window) window="${2:?--window needs a value}"; shift ;;
        --interval) interval="${2:?--interval needs a value}"; shift ;;
        --baseline) baseline="${2:?--baseline needs a value}"; shift ;;
        --alpha) alpha="${2:?--alpha needs a value}"; shift ;;
        --stack) stack="${2:?--stack needs a value}"; shift ;;
        --policy) policy="${2:?--policy needs a value}"; shift ;;
        --build) build=always ;;
        --no-build) build=never ;;
        --json) json_mode ;;
        -h|--help) usage; exit 0 ;;
        *) echo "swarm-demo.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
case "$policy" in learned|dqoes|default) ;; *) echo "swarm-demo.sh: --policy must be learned, dqoes or default" >&2; exit 2 ;; esac
for v in "$duration" "$every" "$window" "$interval" "$baseline"; do
    if ! [[ "$v" =~ ^[0-9]+$ ]] || [ "$v" -eq 0 ]; then
        echo "swarm-demo.sh: '$v' is not a positive whole number" >&2; exit 2
    fi
done
targets="${DQOES_SWARM_TARGETS:-$default_targets}"

need_engine
ensure_images "$build"
node_name="$(docker info -f '{{.Name}}')"
export DQOES_SWARM_NODE="$node_name" DQOES_POLICY="$policy" DQOES_INTERVAL_S="$interval"
ensure_credentials "swarm-$stack" "$node_name"

# ---- teardown, whatever happens -----------------------------------------------------
save_stdout
work="$(mktemp -d "${TMPDIR:-/tmp}/dqoes-swarm.XXXXXX")"
we_initialised=0
gwbridge_before=1
deployed=0
stack_leftovers() {  # what of the stack still exists: "container|network|volume NAME" lines
    docker ps -a --filter "label=com.docker.stack.namespace=$stack" --format 'container {{.Names}}'
    docker network ls --filter "name=^${stack}_default\$" --format 'network {{.Name}}'
    docker volume ls --filter "name=^${stack}_nats-data\$" --format 'volume {{.Name}}'
}
stack_down() {  # remove the stack, its network and its NATS volume, or say loudly what is left
    say "docker stack rm $stack"
    docker stack rm "$stack" >/dev/null 2>&1 || true  # "nothing found" when it was never deployed
    # stack rm returns at once; wait until the tasks and the network are gone.
    local t0=$SECONDS
    while [ -n "$(docker ps -aq --filter "label=com.docker.stack.namespace=$stack")" ] \
        || docker network inspect "${stack}_default" >/dev/null 2>&1; do
        [ $((SECONDS - t0)) -ge 60 ] && break
        sleep 1
    done
    # The volume outlives the stack (Swarm never removes volumes); its container is gone now.
    local i
    for i in 1 2 3 4 5; do
        docker volume inspect "${stack}_nats-data" >/dev/null 2>&1 || break
        docker volume rm "${stack}_nats-data" >/dev/null 2>&1 || sleep 1
    done
    local left
    left="$(stack_leftovers)"
    if [ -n "$left" ]; then
        echo "swarm-demo.sh: TEARDOWN FAILED: stack $stack left these behind after 60 s:" >&2
        echo "$left" | sed 's/^/    /' >&2
        return 1
    fi
}
teardown() {
    local status=$?
    trap - EXIT INT TERM
    restore_stdout
    if [ "$deployed" = 1 ]; then
        if [ "$status" != 0 ] && [ "$status" != 130 ]; then
            echo "swarm-demo.sh: failed (status $status); services and the last log lines:" >&2
            docker stack ps --no-trunc --format '{{.Name}} {{.CurrentState}} {{.Error}}' "$stack" 2>&1 | sed 's/^/    /' >&2 || true
            for s in manager worker; do
                docker service logs --tail 5 "${stack}_$s" 2>&1 | sed 's/^/    /' >&2 || true
            done
        fi
        if ! stack_down && [ "$status" = 0 ]; then
            status=1  # a teardown that left something behind fails the demo
        fi
    fi
    if [ "$we_initialised" = 1 ]; then
        echo "leaving the swarm this script created"
        docker swarm leave --force >/dev/null || true
        if [ "$gwbridge_before" = 0 ]; then
            docker network rm docker_gwbridge >/dev/null 2>&1 || true
        fi
    fi
    rm -rf "$work"
    exit "$status"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- swarm ------------------------------------------------------------------------
state="$(docker info -f '{{.Swarm.LocalNodeState}}')"
if [ "$state" = active ]; then
    [ "$(docker info -f '{{.Swarm.ControlAvailable}}')" = true ] || die "this engine is a swarm worker, not a manager: deploy from a manager"
    echo "swarm: already active here (it stays active afterwards)"
elif [ "$state" = inactive ]; then
    docker network inspect docker_gwbridge >/dev/null 2>&1 || gwbridge_before=0
    say "docker swarm init"
    docker swarm init --advertise-addr 127.0.0.1 >/dev/null || die "docker swarm init failed"
    we_initialised=1
    echo "swarm: initialised a single-node swarm on 127.0.0.1 (left again at the end)"
else
    die "swarm state is '$state'; expected active or inactive"
fi

# ---- deploy ------------------------------------------------------------------------
# A clean store: an earlier run's NATS volume would bring its objectives back.
if [ -n "$(stack_leftovers)" ]; then
    echo "an earlier run of stack $stack left containers, a network or its NATS volume: removing them"
    stack_down || die "cannot start from a clean store (see above)"
fi
say "docker stack deploy -c compose/stack.yml $stack (node $node_name, policy $policy)"
deployed=1
docker stack deploy -c "$stack_file" "$stack" 2>&1 | grep -v -e '^Since --detach' -e '^In a future release' || true

task_of() {  # the running task container of a service
    docker ps --filter "label=com.docker.swarm.service.name=${stack}_$1" --format '{{.Names}}' | head -n 1
}
managed_ids() {
    docker ps -q --filter "label=com.docker.stack.namespace=$stack" --filter label=dqoes.managed=true
}
n_inference=$(grep -c '^ *dqoes.managed: "true"' "$stack_file")
# The CLI inside the manager's task container: it reaches NATS on the overlay
# network (no published port). Looked up each time: Swarm may have replaced it.
# It speaks as the client identity (mounted next to the manager's own credentials).
dqoes() { docker exec -i -e DQOES_NATS_CREDS=/run/dqoes/client.creds "$(task_of manager)" dqoes "$@"; }
url=nats://nats:4222
manager_answers() { [ -n "$(task_of manager)" ] && dqoes status --nats "$url" --json >/dev/null 2>&1; }
all_running() { [ "$(managed_ids | wc -l)" = "$n_inference" ]; }
all_containers_seen() {
    [ "$(dqoes status --nats "$url" --json 2>/dev/null | json_field containers_total)" = "$n_inference" ]
}
wait_for 180 "all $n_inference inference tasks run" all_running
wait_for 120 "the manager answers" manager_answers
wait_for 120 "the worker reports all $n_inference task containers" all_containers_seen
stored="$(dqoes target list --nats "$url" --json 2>/dev/null | json_field targets)"
[ -n "$stored" ] || die "cannot read the stored objectives (an image older than this CLI? make images)"
[ "$stored" = "[]" ] || die "the objective store is not empty at start: $stored"
echo "objective store: empty (a fresh JetStream volume)"

objectives="$work/objectives.txt"
: >"$objectives"
for id in $(managed_ids); do  # objectives from labels, if any were given
    read -r name o < <(docker inspect -f '{{.Name}} {{index .Config.Labels "dqoes.objective_s"}}' "$id")
    if [ -n "$o" ]; then echo "${name#/} $o" >>"$objectives"; fi
done
base="$work/baseline.json"
if [[ "$targets" == *=x* ]]; then
    say "fair share: each container's seconds a batch with no objectives and no limits (${baseline} s)"
    docker exec -i -e DQOES_NATS_CREDS=/run/dqoes/client.creds "$(task_of manager)" python - latencies --nats "$url" --containers "$n_inference" \
        --seconds "$baseline" <"$here/progress.py" >"$base" || die "no batches from every inference container"
    for id in $(managed_ids); do
        read -r name h o < <(docker inspect -f '{{.Name}} {{.Config.Hostname}} {{index .Config.Labels "dqoes.model"}}' "$id")
        printf '  %-44s %-12s %s\n' "${name#/}" "$o" "$(baseline_of "$base" "$h")"
    done | sort
fi

say "objectives through dqoes.targets"
for t in $targets; do
    line="$(resolve_targets "$t" "$base" task_of)"
    read -r name secs how <<<"$line"
    echo "\$ dqoes target set $name $secs${alpha:+ --alpha $alpha}     # $how"
    dqoes target set "$name" "$secs" ${alpha:+--alpha "$alpha"} --nats "$url" | sed 's/^/    /'
    echo "$name $secs" >>"$objectives"
done
t0="$(date +%s.%N)"

say "watching for $duration s: satisfied = the last batch within +-${alpha:-0.10} x its objective"
log="$work/samples.jsonl"
dqoes watch --nats "$url" --json --every "$every" --count $((duration / every)) \
    | progress follow --log "$log" --t0 "$t0" \
    || die "no cluster state arrived on dqoes.cluster.state"

say "final state"
dqoes status --nats "$url"
echo
echo "CPU limits the worker set on the task containers:"
# shellcheck disable=SC2046
print_limits "$objectives" $(managed_ids)
echo
echo "the services' own specs (unchanged: the limits live on the task containers only):"
for s in s1 s2 s3 s4; do
    printf '  %-12s %s\n' "${stack}_$s" "$(docker service inspect -f 'Resources.Limits={{json .Spec.TaskTemplate.Resources.Limits}} tasks={{.Spec.Mode.Replicated.Replicas}}' "${stack}_$s")"
done
limited=0
for id in $(managed_ids); do
    q="$(docker inspect -f '{{.HostConfig.CpuQuota}} {{.HostConfig.NanoCpus}}' "$id")"
    [ "${q% *}" -gt 0 ] || [ "${q#* }" -gt 0 ] && limited=$((limited + 1))
done
echo
# shellcheck disable=SC2046
printf '{"stack": "%s", "node": "%s", "swarm_initialised_here": %s, "task_containers_limited": %d, "objectives": %s, "limits_final_cpus": %s}\n' \
    "$stack" "$node_name" "$([ "$we_initialised" = 1 ] && echo true || echo false)" "$limited" \
    "$("$py" -c 'import json,sys; print(json.dumps({l.split()[0]: float(l.split()[1]) for l in open(sys.argv[1]) if l.strip()}))' "$objectives")" \
    "$(limits_json $(managed_ids))" >"$work/extra.json"
progress summary --log "$log" --window "$window" --label "swarm $policy" || true
echo "task containers with a CPU limit set by the worker: $limited of $n_inference"
progress summary --log "$log" --window "$window" --label "$policy" --extra "$work/extra.json" --json | emit_json
