#!/usr/bin/env bash
set -u
B=/work/main/target/release/deltafin
O=/tmp/dsv3lfu
cd /work/main
for r in uniform published; do
  D=/work/tmp-dsv3-$r
  rm -rf $D
  if [ $r = uniform ]; then $B synth --preset dsv3-bench --out $D > $O/synth-$r.txt 2>&1
  else $B synth --preset dsv3-bench --routing published --out $D > $O/synth-$r.txt 2>&1; fi
  $B plan --model $D --ram 3840M --context-memory 0 --json > $O/plan-$r.json 2> $O/plan-$r.err
  bench/cgrun.sh 4294967296 lfu24 $B bench serve --model $D --memory-budget 3840M --prompt-tokens 4 --streams 1,2,4 --tokens 24 --json > $O/serve24-$r.json 2> $O/serve24-$r.log
  bench/cgrun.sh 4294967296 lfu8 $B bench serve --model $D --memory-budget 3840M --prompt-tokens 4 --streams 8 --tokens 48 --json > $O/serve8-$r.json 2> $O/serve8-$r.log
  rm -rf $D
done
echo done > $O/done
