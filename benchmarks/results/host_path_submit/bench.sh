# Issue 38 part 3: tfring.core's per-call latency, the build before
# submit_array (old: main at 3f15ce4, its Python and its core module) against
# this branch (new), in one run, two rounds with the order swapped; run under
# the shared heavy-command lock. The old tree: git archive 3f15ce4 | tar -x -C /tmp/h38s/old
set -x
cd /work/wt-38
OUT=/tmp/h38s/bench
mkdir -p $OUT
uptime
for round in 1 2; do
  order="old new"; [ $round = 2 ] && order="new old"
  for b in $order; do
    tree=/work/wt-38; [ $b = old ] && tree=/tmp/h38s/old
    PYTHONPATH=$tree TFRING_CORE_LIBRARY=/tmp/h38s/core_$b.so timeout 200 python -m tfring.runner.launch -np 2 --timeout 180 \
      python benchmarks/core_latency.py --sizes 4K,64K,1M --ops allreduce,allreduce_raw,allgather \
      --iters 2000 --label $b-r$round --out $OUT/core_latency.jsonl
  done
done
uptime
