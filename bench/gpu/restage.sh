#!/usr/bin/env bash
# Here, after ../shared/gpu/stage-vllm-wheels: lay the staged chunks c00..c07 out again as s00.. of at most 40 MiB
# each, so that every `run` call carries one folder beside the ~19 MiB tree under its 64 MiB limit (c00 and
# c02, 46 MiB each, do not fit beside it). The vLLM wheel is cut into 38-MiB parts (install.sh's `cat part*`
# keeps their order); the xgrammar wheel into two halves that the last call joins:
#   cat /tmp/dw/xgrammar-*.whl.x0 /tmp/dw/xgrammar-*.whl.x1 > /tmp/dw/<wheel>   (see README "One session")
set -euo pipefail
cd "${1:-.device-wheels}"
rm -rf s?? /tmp/restage && mkdir -p /tmp/restage
W=$(cd c03 && ls *.whl.part00 | sed 's/\.part00$//')
cat c0*/"$W".part* > /tmp/restage/"$W"
(cd /tmp/restage && split -b 38M -d -a 2 "$W" "$W.part" && rm "$W")
X=$(cd c02 && ls xgrammar-*.whl)
split -b 24M -d -a 1 "c02/$X" "/tmp/restage/$X.x"
limit=$((40 * 1024 * 1024)); n=0; size=0; d=s00; mkdir -p $d
next() { n=$((n + 1)); d=$(printf "s%02d" $n); mkdir -p "$d"; size=0; }
for f in c00/*.whl c01/*.whl /tmp/restage/*; do   # in order; a new folder when the next file would overflow this one
  s=$(stat -c %s "$f")
  [ $((size + s)) -le $limit ] || next
  cp "$f" "$d/"; size=$((size + s))
done
rm -rf /tmp/restage
du -sh s??
