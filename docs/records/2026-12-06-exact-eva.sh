#!/bin/bash
# alternate default and --exact eva runs, reps 1 each, 3 pairs
. /work/main/.venv/bin/activate
cd /work/main
M=$1
for i in 1 2 3; do
  if [ $((i % 2)) = 1 ]; then order="def exact"; else order="exact def"; fi
  for mode in $order; do
    flag=""; [ $mode = exact ] && flag="--exact"
    continuum bench eva --model $M --threads 2 --reps 1 --modes stateful,cold $flag --json > /tmp/m/eva-$M-$mode-$i.json 2>/tmp/m/eva-$M-$mode-$i.err
  done
done
