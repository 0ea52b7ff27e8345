#!/usr/bin/env bash
# Re-make the report screenshots in docs/report/: each fault kind is a real 4-rank msrun
# job on CPU (rankscope demo, about a minute each, one after the other), and its
# report.html is photographed by headless Chromium.
# Usage (from the checkout, after `make install`): docs/report/shots.sh [WORK_DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
work=${1:-$(mktemp -d)}
rankscope="$repo/.venv/bin/rankscope"
browser=$(command -v chromium || command -v chromium-browser)

shoot() {  # name fault height
    local out="$work/$1"
    timeout 600 "$rankscope" demo --fault "$2" --export-dir "$out" > "$out.log" 2>&1
    local reports=("$out"/incidents/*/report.html)
    local report=${reports[0]}
    "$rankscope" report "$(dirname "$report")" > /dev/null
    "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size="1280,$3" \
        --screenshot="$here/$1.png" "file://$report" 2> /dev/null
    echo "$1: $report -> $here/$1.png"
}

shoot nan nan_batch:2:4 2900
shoot outlier scale_grad:1:5 2500
shoot replica perturb_weight:3:4 2500
shoot lost_rank kill:2:4 2500
