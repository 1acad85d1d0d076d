#!/usr/bin/env bash
# Reproduce the benchmark figures of issue 4 (ctxengine bench) on the published trajectories:
# $CTXENGINE_DATA, else data/ (scripts/fetch_data downloads them there), else ../shared/data.
#   scripts/bench_all.sh [OUTDIR]
# Writes a table per run to stdout and JSON + charts to OUTDIR (default: bench-out/).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA="${CTXENGINE_DATA:-}"
if [ -z "$DATA" ]; then
  for d in data ../shared/data; do
    if [ -f "$d/swe_agent_java_multi_swe_bench.jsonl" ]; then DATA="$d"; break; fi
  done
fi
if [ -z "$DATA" ]; then
  echo "no trajectories: set CTXENGINE_DATA=DIR, or run scripts/fetch_data to download them into data/" >&2
  exit 2
fi
OUT="${1:-bench-out}"
mkdir -p "$OUT"
SWE="$DATA/swe_agent_java_multi_swe_bench.jsonl"

echo "== 1. all 42 trajectories, every built-in engine (target: < 60 s)"
/usr/bin/time -f "wall %e s" python -m ctxengine bench "$DATA"/*.jsonl \
  --json "$OUT/all.json" --chart "$OUT/all.html"

echo "== 2. long sessions: --compose 5 on the SWE-agent file at 128K, system_and_3 placement"
python -m ctxengine bench "$SWE" --compose 5 --context-length 128000 --placement system_and_3 \
  --json "$OUT/compose5_system_and_3.json" --chart "$OUT/compose5_system_and_3.png"

echo "== 3. the same with the cache planner (target for the best engine: <= 0.55x none,"
echo "==    0 over-window, 0 invalid, 100 % facts)"
python -m ctxengine bench "$SWE" --compose 5 --context-length 128000 --placement planner \
  --json "$OUT/compose5_planner.json" --chart "$OUT/compose5_planner.png"
