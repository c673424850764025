#!/usr/bin/env bash
# Give this machine a running Docker engine, idempotently.
#
# Why: the project's machines (and CI) have only the docker client; the docker
# runtime's tests and the image build need a real engine. Debian's docker.io
# (Engine 20.10, cgroup v1 + cgroupfs driver here) is installed only when
# dockerd is missing, and dockerd is started in the background only when
# `docker info` fails. Safe to run again at any time, e.g. to restart a
# daemon that was killed.
#
# Env: DOCKERD_LOG (default /var/log/dockerd.log), DOCKER_WAIT_S (default 60).
set -euo pipefail

log_file="${DOCKERD_LOG:-/var/log/dockerd.log}"
wait_s="${DOCKER_WAIT_S:-60}"

if docker info >/dev/null 2>&1; then
    echo "install-docker: engine already running ($(docker version -f '{{.Server.Version}}' 2>/dev/null))"
    exit 0
fi

if [ "$(id -u)" != 0 ]; then
    echo "install-docker: must run as root to install or start dockerd" >&2
    exit 1
fi

if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
    echo "install-docker: installing docker.io"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq docker.io >/dev/null
fi

# A live (not zombie) dockerd from its pid file: wait for it rather than start another.
dockerd_alive() {
    local pid state
    pid="$(cat /var/run/docker.pid 2>/dev/null)" || return 1
    [ -n "$pid" ] && [ -r "/proc/$pid/stat" ] || return 1
    state="$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)"
    [ -n "$state" ] && [ "$state" != Z ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ]
}

if ! dockerd_alive; then
    # One that died uncleanly leaves its pid file behind and refuses to start.
    rm -f /var/run/docker.pid
    mkdir -p "$(dirname "$log_file")"
    echo "install-docker: starting dockerd (log: $log_file)"
    # setsid: the daemon outlives this script and the caller's process group.
    setsid dockerd >>"$log_file" 2>&1 </dev/null &
fi

deadline=$((SECONDS + wait_s))
until docker info >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
        echo "install-docker: dockerd not ready after ${wait_s}s; last lines of $log_file:" >&2
        tail -n 20 "$log_file" >&2 || true
        exit 1
    fi
    sleep 0.2
done
echo "install-docker: engine ready ($(docker version -f '{{.Server.Version}}'))"
