#!/bin/bash
# Bare metal, coordinator host: a Ray head and the rankscope coordinator on it.
# Run once, before the training nodes start (their agents retry until it is up).
#
#   deploy/baremetal/start-coordinator.sh [EXPORT_DIR]
#
# Environment: RAY_PORT (6379), COORDINATOR_PORT (5555), RANKSCOPE_JOB (default),
# ON_DIVERGENCE (pause), CURVE_DIR (/etc/rankscope/curve: coordinator.key_secret and
# allowed/ with the agents' public keys, from `rankscope keys`).
set -euo pipefail

EXPORT_DIR=${1:-$PWD/rankscope-exports}
RAY_PORT=${RAY_PORT:-6379}
COORDINATOR_PORT=${COORDINATOR_PORT:-5555}
RANKSCOPE_JOB=${RANKSCOPE_JOB:-default}
ON_DIVERGENCE=${ON_DIVERGENCE:-pause}
CURVE_DIR=${CURVE_DIR:-/etc/rankscope/curve}

mkdir -p "$EXPORT_DIR"
# The coordinator needs one CPU of Ray; training does not run on this Ray.
ray start --head --port="$RAY_PORT" --num-cpus=1 --include-dashboard=false
trap 'ray stop' EXIT

# Foreground: Ctrl-C (or the service manager) stops the coordinator, then Ray.
rankscope coordinator \
    --address "127.0.0.1:$RAY_PORT" \
    --bind "tcp://0.0.0.0:$COORDINATOR_PORT" \
    --export-dir "$EXPORT_DIR" \
    --job "$RANKSCOPE_JOB" \
    --on-divergence "$ON_DIVERGENCE" \
    --curve-secret "$CURVE_DIR/coordinator.key_secret" \
    --allow-dir "$CURVE_DIR/allowed"
