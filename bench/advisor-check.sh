#!/usr/bin/env bash
# The advisor against reality (issue 15, docs/advisor.md): three workloads
# run for real on a parcache mount under several policies, and predicted
# for the same policies by replaying the trace `mount --record` took of the
# run under parcache's defaults, on a cluster model `sim calibrate-cluster`
# measured on this machine. Prints predicted/measured time per policy and
# whether the simulator ranks the policies as the real runs do (each
# measured time is the faster of two runs).
#
#   bench/advisor-check.sh [SEQ_MIB [TARBALL]]
#
# Workloads: fio sequential 1 MiB writes (end fsync) then reads of SEQ_MIB
# (default 256); `tar x` of TARBALL (default: a tarball made here of some
# crates' sources from ~/.cargo/registry); an IOR-style shared file, two
# processes writing then reading disjoint halves of it with 1 MiB transfers.
set -euo pipefail
cd "$(dirname "$0")/.."
seq_mib=${1:-256}
tarball=${2:-}
pc=$PWD/target/release/parcache
cargo build --release --quiet -p parcache-cli
command -v fio >/dev/null || { echo "advisor-check: fio is missing (scripts/setup.sh installs it)" >&2; exit 1; }

work=$(mktemp -d /tmp/parcache-advisor-check.XXXXXX)
cluster=$work/cluster
mnt=$work/mnt
mkdir -p "$mnt"
cleanup() {
  fusermount3 -u "$mnt" 2>/dev/null || true
  "$pc" down --data "$cluster" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

if [ -z "$tarball" ]; then
  src=$(ls -d "$HOME"/.cargo/registry/src/*/ 2>/dev/null | head -1)
  [ -n "$src" ] || { echo "advisor-check: give a TARBALL (no ~/.cargo/registry/src here)" >&2; exit 1; }
  tarball=$work/src.tar
  (cd "$src" && tar cf "$tarball" $(ls | grep -E '^(tokio|plotters|regex|syn-|serde|clap|redb|fuser|rustix|libc)' | head -40))
fi
echo "advisor-check: tarball $(tar tf "$tarball" | wc -l) entries, $(du -m "$tarball" | cut -f1) MiB; sequential $seq_mib MiB"

"$pc" up --data "$cluster" --iods 4 >/dev/null
"$pc" sim calibrate-cluster --dir "$work" --mib 128 --data "$cluster" --out "$work/model.toml" 2>&1 | sed 's/^/  calibrated: /'

policies=("" "write=write-through" "write=write-back" "prefetch=none" "consistency=posix")
names=("default" "write-through" "write-back" "prefetch=none" "posix")

run_workload() { # workload dir
  case $1 in
    seq)
      fio --name=seq --directory="$2" --rw=write --bs=1M --size="${seq_mib}M" --end_fsync=1 --ioengine=psync --output=/dev/null
      fio --name=seq --directory="$2" --rw=read --bs=1M --size="${seq_mib}M" --ioengine=psync --output=/dev/null
      ;;
    tar) tar xf "$tarball" -C "$2" ;;
    ior)
      local f=$2/shared
      fio --name=ior --filename="$f" --rw=write --bs=1M --size=64M --numjobs=2 --offset_increment=64M \
        --end_fsync=1 --ioengine=psync --output=/dev/null
      fio --name=ior --filename="$f" --rw=read --bs=1M --size=64M --numjobs=2 --offset_increment=64M \
        --ioengine=psync --output=/dev/null
      ;;
  esac
}

declare -A measured predicted
# Each policy runs twice, in two passes, and the faster run counts: the
# machine is shared and one pass's data is still going down to the disks
# while the next runs. The first pass's default run is the one recorded.
for w in seq tar ior; do
  for pass in 1 2; do
    for i in "${!policies[@]}"; do
      dir=$w-$i-$pass
      "$pc" mkdir --data "$cluster" "pc:/$dir" >/dev/null
      if [ -n "${policies[$i]}" ]; then
        "$pc" policy set --data "$cluster" "pc:/$dir" ${policies[$i]} >/dev/null
      fi
      rec=()
      [ "$i" = 0 ] && [ "$pass" = 1 ] && rec=(--record "$work/$w.jsonl")
      "$pc" mount --data "$cluster" "$mnt" "${rec[@]}" >/dev/null 2>"$work/mount.log" &
      mpid=$!
      for _ in $(seq 100); do mountpoint -q "$mnt" && break; sleep 0.1; done
      t0=$(date +%s.%N)
      run_workload "$w" "$mnt/$dir"
      t1=$(date +%s.%N)
      fusermount3 -u "$mnt"
      wait "$mpid"
      t=$(echo "$t1 - $t0" | bc -l)
      prev=${measured[$w,$i]:-}
      if [ -z "$prev" ] || [ "$(echo "$t < $prev" | bc -l)" = 1 ]; then
        measured[$w,$i]=$t
      fi
      echo "  ran $w under ${names[$i]} (pass $pass): $(printf %.2f "$t") s"
    done
  done
  for i in "${!policies[@]}"; do
    set_args=()
    [ -n "${policies[$i]}" ] && set_args=(--set "${policies[$i]}")
    predicted[$w,$i]=$("$pc" sim replay "$work/$w.jsonl" --cluster "$work/model.toml" "${set_args[@]}" --format json |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["outcome"]["elapsed"])')
  done
done

echo
echo "predicted (replay of the default run's trace) against measured (the real mount), seconds"
printf '%-6s %-15s %10s %10s %10s\n' workload policy predicted measured pred/meas
for w in seq tar ior; do
  for i in "${!policies[@]}"; do
    p=${predicted[$w,$i]}
    m=${measured[$w,$i]}
    printf '%-6s %-15s %10.2f %10.2f %10.2f\n' "$w" "${names[$i]}" "$p" "$m" "$(echo "$p / $m" | bc -l)"
  done
  # Rankings: the policies ordered by predicted and by measured time.
  pr=$(for i in "${!policies[@]}"; do echo "${predicted[$w,$i]} ${names[$i]}"; done | sort -g | cut -d' ' -f2 | paste -sd'<')
  mr=$(for i in "${!policies[@]}"; do echo "${measured[$w,$i]} ${names[$i]}"; done | sort -g | cut -d' ' -f2 | paste -sd'<')
  best_p=${pr%%<*}
  best_m=${mr%%<*}
  echo "  $w ranking predicted: $pr"
  echo "  $w ranking measured:  $mr"
  echo "  $w best agrees: $([ "$best_p" = "$best_m" ] && echo yes || echo no)"
done
