#!/usr/bin/env bash
# Build DQoES's container images without any registry.
#
# Why: nothing can be pulled on the project's machines, so the base image is
# made from Debian packages (debootstrap + docker import) and every Python
# package is built into a wheelhouse ON THE HOST, then installed in the image
# with `pip install --no-index` (no network during `docker build`; the HTTPS
# proxy's CA is still copied into the base so containers can reach PyPI if
# they must).
#
# Images:
#   dqoes-base:bookworm     Debian bookworm minbase, python3 (3.11), venv, pip,
#                           CA files, libjemalloc2, tini
#   dqoes:latest            control plane (manager/worker/cli): /opt/venv with
#                           this repo's wheel and its deps, no torch
#   dqoes-workload:latest   dqoes:latest + torch (CPU) and jemalloc preloaded
#
# Idempotent: the base is skipped when it exists (unless --force), the
# debootstrap rootfs is cached as a tarball, wheels already in the wheelhouse
# are reused, and docker build reuses its layer cache. The build stages
# (wheels installed into a venv, about 3.7 GB for the two images) are removed
# once their image is built, unless --keep-stages keeps them for faster rebuilds.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

usage() {
    cat <<USAGE
usage: compose/images/build.sh [options]

Build dqoes-base:bookworm, dqoes:latest and dqoes-workload:latest offline.

options:
  --force        rebuild the base image and its cached rootfs (debootstrap again)
  --base-only    build only dqoes-base:bookworm (what the docker tests need)
  --no-workload  build the base and dqoes:latest, not dqoes-workload:latest
  --keep-stages  keep the build stages (dqoes-stage:<image>, GBs): a rebuild after a
                 code change then reuses their layers
  --cache DIR    cache directory (default: \$DQOES_CACHE or ~/.cache/dqoes)
  -h, --help     show this help

env:
  DQOES_CACHE    cache directory (rootfs tarball, wheelhouse)
  DEBIAN_MIRROR  debootstrap mirror (default http://deb.debian.org/debian)
  PYTHON         host Python 3.11 used for 'pip wheel' (default: .venv/bin/python
                 of the repo if present, else python3)
USAGE
}

force=0
base_only=0
workload=1
keep_stages=0
cache="${DQOES_CACHE:-$HOME/.cache/dqoes}"
while [ $# -gt 0 ]; do
    case "$1" in
        --force) force=1 ;;
        --base-only) base_only=1 ;;
        --no-workload) workload=0 ;;
        --keep-stages) keep_stages=1 ;;
        --cache) cache="$2"; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "build.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
base_image="dqoes-base:bookworm"
includes="python3,python3-venv,python3-pip,ca-certificates,libjemalloc2,tini"
torch_version="2.13.0"
# Not dependencies of torch's: every workload uses numpy; the HTTP serving mode
# (--serve) runs on starlette and uvicorn (the `workloads` extra).
torch_extra="numpy starlette uvicorn"

# pip warns about every missing file:// index entry of this machine's pip.conf; drop those.
quiet_pip() { grep -v "is ignored: it is neither a file nor a directory" || true; }
step() { printf '\n== %s (%s)\n' "$1" "$(date +%T)"; }
need_root() { [ "$(id -u)" = 0 ] || { echo "build.sh: $1 needs root" >&2; exit 1; }; }

docker info >/dev/null 2>&1 || {
    echo "build.sh: no Docker engine (run .ci/install-docker.sh)" >&2; exit 1; }
mkdir -p "$cache"

# ---- (a) base image --------------------------------------------------------
build_base() {
    if [ "$force" = 0 ] && docker image inspect "$base_image" >/dev/null 2>&1; then
        echo "base: $base_image exists (--force to rebuild)"
        return
    fi
    # The cached rootfs is keyed by what goes into it.
    local key rootfs_tar
    key="$(printf '%s\n' "$includes" /usr/local/share/ca-certificates/* \
        | cat - /usr/local/share/ca-certificates/* 2>/dev/null | cksum | cut -d' ' -f1)"
    rootfs_tar="$cache/rootfs-bookworm-$key.tar"
    if [ "$force" = 1 ] || [ ! -s "$rootfs_tar" ]; then
        step "debootstrap bookworm"
        need_root debootstrap
        command -v debootstrap >/dev/null 2>&1 || {
            apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
        local rootfs
        rootfs="$(mktemp -d "${TMPDIR:-/tmp}/dqoes-rootfs.XXXXXX")"
        # shellcheck disable=SC2064
        trap "rm -rf '$rootfs'" EXIT
        debootstrap --variant=minbase --include="$includes" bookworm "$rootfs" "$mirror" \
            >"$cache/debootstrap.log" 2>&1 || {
            echo "build.sh: debootstrap failed; see $cache/debootstrap.log" >&2; exit 1; }
        # The host's extra CAs (HTTPS proxy) so the image can reach PyPI.
        if compgen -G "/usr/local/share/ca-certificates/*" >/dev/null; then
            cp -r /usr/local/share/ca-certificates/. "$rootfs/usr/local/share/ca-certificates/"
            chroot "$rootfs" update-ca-certificates >/dev/null 2>&1
        fi
        rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
        tar -C "$rootfs" -cf "$rootfs_tar.part" . && mv "$rootfs_tar.part" "$rootfs_tar"
        rm -rf "$rootfs"
        trap - EXIT
    else
        echo "base: reusing cached rootfs $rootfs_tar"
    fi
    step "docker import $base_image"
    docker import \
        -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        -c 'ENV LANG=C.UTF-8' \
        -c 'CMD ["/bin/bash"]' \
        - "$base_image" <"$rootfs_tar" >/dev/null
}

# ---- (b) wheelhouse on the host ---------------------------------------------
record_of() {  # a wheel's RECORD (every file's sha256), i.e. its contents
    "$(pick_python)" -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
print(z.read(next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))).decode())' "$1"
}

pick_python() {
    if [ -n "${PYTHON:-}" ]; then echo "$PYTHON"
    elif [ -x "$repo/.venv/bin/python" ]; then echo "$repo/.venv/bin/python"
    else command -v python3
    fi
}

build_wheels() {
    local py app_wh torch_wh
    py="$(pick_python)"
    app_wh="$cache/wheels/app"
    torch_wh="$cache/wheels/torch"
    mkdir -p "$app_wh" "$torch_wh"
    step "wheels: this repo and its deps -> $app_wh"
    # Our own wheel is rebuilt every time (the repo keeps changing); deps are reused.
    # Build from a copy: an in-tree build would leave build/ and *.egg-info in the repo.
    local src
    src="$(mktemp -d "${TMPDIR:-/tmp}/dqoes-src.XXXXXX")"
    mkdir -p "$src/tree"
    tar -C "$repo" --exclude=./.git --exclude=./.venv --exclude=./build --exclude=./dist \
        --exclude='*.egg-info' --exclude=__pycache__ --exclude=.pytest_cache \
        --exclude=.ruff_cache --exclude=.hypothesis --exclude=./out -cf - . | tar -C "$src/tree" -xf -
    mkdir -p "$src/deps"
    "$py" -m pip wheel -q "$src/tree" -w "$src/deps" --find-links "$app_wh" 2>&1 | quiet_pip
    # Our own wheel differs byte for byte on every build (timestamps): keep the
    # old file when its contents (RECORD hashes) are the same, so docker build
    # hits its layer cache and a rerun takes seconds.
    local new old
    new="$(compgen -G "$src/deps/dqoes-*.whl" | head -n 1)"
    old="$(compgen -G "$app_wh/dqoes-*.whl" | head -n 1 || true)"
    if [ -z "$old" ] || [ "$(record_of "$old")" != "$(record_of "$new")" ]; then
        rm -f "$app_wh"/dqoes-*.whl
        cp "$new" "$app_wh/"
        echo "wheels: dqoes wheel changed: images are rebuilt"
    else
        echo "wheels: dqoes wheel unchanged: docker build reuses its cache"
    fi
    rm -f "$src"/deps/dqoes-*.whl
    cp -n "$src"/deps/*.whl "$app_wh/" 2>/dev/null || true
    rm -rf "$src"
    if [ "$workload" = 1 ]; then
        step "wheels: torch==$torch_version (CPU) and its deps -> $torch_wh"
        "$py" -m pip download -q "torch==$torch_version" --no-deps -d "$torch_wh" 2>&1 | quiet_pip
        # Refuse a CUDA build: the CPU wheel carries +cpu in its name.
        local torch_file
        torch_file="$(compgen -G "$torch_wh/torch-$torch_version+cpu-*.whl" | head -n 1 || true)"
        if [ -z "$torch_file" ]; then
            echo "build.sh: pip did not pick the local CPU torch wheel:" >&2
            ls "$torch_wh" >&2; exit 1
        fi
        # Its dependencies as its own metadata lists them (filelock, sympy,
        # networkx, jinja2, fsspec, typing-extensions, setuptools, ...), plus the extras above.
        # shellcheck disable=SC2086
        "$py" -m pip wheel -q "$torch_file" $torch_extra -w "$torch_wh" 2>&1 | quiet_pip
    fi
}

# ---- (c) docker build (legacy builder) ---------------------------------------
# Each image gets its own small context: the Dockerfile and its wheel folder
# only (the legacy builder sends the whole context to the daemon).
docker_build() {
    local tag="$1" dockerfile="$2" wheels="$3" ctx
    ctx="$cache/context/${tag%%:*}"
    rm -rf "$ctx"; mkdir -p "$ctx/wheels"
    cp "$here/$dockerfile" "$ctx/Dockerfile"
    cp -l "$wheels"/*.whl "$ctx/wheels/" 2>/dev/null || cp "$wheels"/*.whl "$ctx/wheels/"
    step "docker build $tag"
    # With --keep-stages the build stage is tagged too (dqoes-stage:<image>), so the
    # prune below keeps it and the next build reuses its layers; otherwise it is left
    # untagged and the prune removes it.
    if [ "$keep_stages" = 1 ]; then
        DOCKER_BUILDKIT=0 docker build -q --force-rm --target build -t "dqoes-stage:${tag%%:*}" "$ctx" >/dev/null
    else
        docker image rm "dqoes-stage:${tag%%:*}" >/dev/null 2>&1 || true  # left by a --keep-stages build
    fi
    DOCKER_BUILDKIT=0 docker build -q --force-rm -t "$tag" "$ctx" >/dev/null
    rm -rf "$ctx"
}

# Older builds of ours and build stages (label dqoes.build) left untagged: remove them.
prune_old() {
    docker image prune -f --filter label=dqoes.build=1 >/dev/null || true
}

t0=$SECONDS
build_base
if [ "$base_only" = 0 ]; then
    build_wheels
    docker_build dqoes:latest Dockerfile "$cache/wheels/app"
    if [ "$workload" = 1 ]; then
        docker_build dqoes-workload:latest Dockerfile.workload "$cache/wheels/torch"
    fi
    prune_old
fi
step "done in $((SECONDS - t0)) s"
docker image ls --format '{{.Repository}}:{{.Tag}}\t{{.Size}}' | grep -E '^dqoes' || true
