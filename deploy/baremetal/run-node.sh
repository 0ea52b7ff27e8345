#!/bin/bash
# Bare metal, every training node: msrun for this node's ranks under `rankscope launch`,
# attached to the node agent of rankscope-agent.service. Start it on all nodes with the
# same MASTER_ADDR and NNODES and each node's own NODE_RANK (0 .. NNODES-1).
#
#   deploy/baremetal/run-node.sh NODE_RANK NNODES MASTER_ADDR TRAIN_SCRIPT [ARGS...]
#
# Environment: RANKS_PER_NODE (8), MASTER_PORT (8118), RANKSCOPE_JOB (default, as in
# /etc/rankscope/agent.env), EXPORT_DIR (./rankscope-out), RANKSCOPE_CONFIG (optional
# config.json), AGENT_SOCKET (/run/rankscope/agent.sock).
set -euo pipefail

if [ "$#" -lt 4 ]; then
    echo "usage: $0 NODE_RANK NNODES MASTER_ADDR TRAIN_SCRIPT [ARGS...]" >&2
    exit 2
fi
NODE_RANK=$1
NNODES=$2
MASTER_ADDR=$3
shift 3
case "$NODE_RANK$NNODES" in
    *[!0-9]*) echo "$0: NODE_RANK and NNODES must be integers" >&2; exit 2 ;;
esac
if [ "$NODE_RANK" -ge "$NNODES" ]; then
    echo "$0: NODE_RANK $NODE_RANK must be below NNODES $NNODES" >&2
    exit 2
fi

RANKS_PER_NODE=${RANKS_PER_NODE:-8}
MASTER_PORT=${MASTER_PORT:-8118}
RANKSCOPE_JOB=${RANKSCOPE_JOB:-default}
EXPORT_DIR=${EXPORT_DIR:-$PWD/rankscope-out}
AGENT_SOCKET=${AGENT_SOCKET:-/run/rankscope/agent.sock}

if [ ! -S "$AGENT_SOCKET" ]; then
    echo "$0: no node agent at $AGENT_SOCKET (systemctl status rankscope-agent)" >&2
    exit 1
fi

config_args=()
if [ -n "${RANKSCOPE_CONFIG:-}" ]; then
    config_args=(--config "$RANKSCOPE_CONFIG")
fi

exec rankscope launch \
    --agent "ipc://$AGENT_SOCKET" \
    --job "$RANKSCOPE_JOB" \
    --export-dir "$EXPORT_DIR" \
    "${config_args[@]}" \
    -- msrun \
        --worker_num=$((NNODES * RANKS_PER_NODE)) \
        --local_worker_num="$RANKS_PER_NODE" \
        --master_addr="$MASTER_ADDR" \
        --master_port="$MASTER_PORT" \
        --node_rank="$NODE_RANK" \
        --log_dir="$EXPORT_DIR/msrun_logs/node$NODE_RANK" \
        --join=True \
        "$@"
