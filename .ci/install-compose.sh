#!/usr/bin/env bash
# Give this machine a compose command, idempotently (`make compose-demo` runs it).
#
# Why: a fresh machine of this project's kind has the docker client, and
# `make images` installs the engine, but nothing else installs compose: the
# compose demo then stopped after building its images. `docker compose` (v2)
# is used when present; else Debian's docker-compose 1.29 (v1) is installed
# (root). Both read compose/docker-compose.yml. Exits non-zero, saying why,
# when neither can be had.
set -euo pipefail

if docker compose version >/dev/null 2>&1; then
    echo "install-compose: docker compose $(docker compose version --short 2>/dev/null) present"
    exit 0
fi
if command -v docker-compose >/dev/null 2>&1; then
    echo "install-compose: docker-compose $(docker-compose version --short 2>/dev/null) present"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "install-compose: neither 'docker compose' (v2) nor docker-compose (v1) is installed, and" \
        "installing Debian's docker-compose needs root (sudo apt-get install -y docker-compose)" >&2
    exit 1
fi
echo "install-compose: installing Debian's docker-compose"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends docker-compose >/dev/null
command -v docker-compose >/dev/null 2>&1 || { echo "install-compose: docker-compose still missing" >&2; exit 1; }
echo "install-compose: docker-compose $(docker-compose version --short 2>/dev/null) installed"
