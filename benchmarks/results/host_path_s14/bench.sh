set -x
cd /work/wt-38
OUT=/tmp/h38/bench
mkdir -p $OUT
uptime
for round in 1 2; do
  order="old new"; [ $round = 2 ] && order="new old"
  for b in $order; do
    TFRING_CORE_LIBRARY=/tmp/h38/libs/core_$b.so timeout 200 python -m tfring.runner.launch -np 2 --timeout 180 python benchmarks/core_latency.py --label $b-r$round --out $OUT/core_latency.jsonl
    TFRING_LIBRARY=/tmp/h38/libs/ops_$b.so timeout 300 python -m tfring.runner.launch -np 2 --timeout 280 python benchmarks/collectives.py --sizes 4K,1M --collectives allreduce --budget 5 --label $b-r$round --out $OUT/collectives.jsonl 2>&1 | grep -v "^\[.\]<stderr>" | tail -8
  done
done
uptime
