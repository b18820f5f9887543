#!/usr/bin/env bash
# Run-time host tuning for seqstream's busy-spinning threads on isolated cores (Linux).
# The boot-time half (isolcpus=, nohz_full=, rcu_nocbs=, irqaffinity=) and the reasons for
# every step are in docs/host-tuning.md.
#
# Usage: scripts/tune-host.sh [--isolated LIST] [--housekeeping LIST] [--dry-run | --apply]
#                             [--rmem-max BYTES] [--wmem-max BYTES]
#   --isolated LIST      CPUs the spinning threads own, e.g. 2-15,18-31
#                        (default: the kernel's /sys/devices/system/cpu/isolated)
#   --housekeeping LIST  CPUs for the OS and interrupts (default: online CPUs not isolated)
#   --dry-run            print what would change, change nothing (the default)
#   --apply              change it (as root); not persistent: run it at every boot
#   --rmem-max BYTES     net.core.rmem_max, >= the sequencer's --recv-buffer (default 16 MiB)
#   --wmem-max BYTES     net.core.wmem_max, >= the replicator's --send-buffer (default 16 MiB)
#
# Steps: CPU frequency governor -> performance; transparent huge pages -> madvise, no
# defrag; irqbalance stopped; every IRQ, the default IRQ affinity and unbound workqueues
# moved to the housekeeping CPUs; socket buffer sysctls. A step whose files this machine lacks
# (no cpufreq in a VM, no irqbalance) is reported as skipped, never fatal.
# TUNE_HOST_ROOT=DIR prefixes every /sys and /proc path (for testing against a copy).
set -euo pipefail

usage() { sed -n '2,21s/^# \{0,1\}//p' "$0"; }

apply=0
isolated=
housekeeping=
rmem_max=$((16 << 20))
wmem_max=$((16 << 20))
root=${TUNE_HOST_ROOT:-}

while [ $# -gt 0 ]; do
  case "$1" in
    --isolated) isolated=${2:?--isolated needs a CPU list}; shift ;;
    --housekeeping) housekeeping=${2:?--housekeeping needs a CPU list}; shift ;;
    --dry-run) apply=0 ;;
    --apply) apply=1 ;;
    --rmem-max) rmem_max=${2:?--rmem-max needs bytes}; shift ;;
    --wmem-max) wmem_max=${2:?--wmem-max needs bytes}; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "tune-host.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done

for n in "$rmem_max" "$wmem_max"; do
  [[ $n =~ ^[0-9]+$ ]] || { echo "tune-host.sh: not a byte count: $n" >&2; exit 2; }
done

say() { printf '%s\n' "$*"; }
skip() { printf 'skip: %s\n' "$*"; }
failures=0

# expand LIST: "2-4,7" -> "2 3 4 7" (one per line)
expand() {
  local part lo hi i
  local IFS=,
  for part in $1; do
    [ -n "$part" ] || continue
    if [[ $part =~ ^([0-9]+)-([0-9]+)$ ]]; then
      lo=${BASH_REMATCH[1]} hi=${BASH_REMATCH[2]}
      ((lo <= hi)) || { echo "tune-host.sh: bad CPU range $part" >&2; exit 2; }
      for ((i = lo; i <= hi; i++)); do echo "$i"; done
    elif [[ $part =~ ^[0-9]+$ ]]; then
      echo "$part"
    else
      echo "tune-host.sh: bad CPU list '$1'" >&2
      exit 2
    fi
  done
}

# compress "0 1 2 5" (any order) -> "0-2,5"
compress() {
  local out='' start='' prev='' c
  for c in $(printf '%s\n' "$@" | sort -n -u); do
    if [ -z "$start" ]; then
      start=$c prev=$c
    elif ((c == prev + 1)); then
      prev=$c
    else
      out+="${out:+,}$start$([ "$start" = "$prev" ] || echo "-$prev")"
      start=$c prev=$c
    fi
  done
  [ -z "$start" ] || out+="${out:+,}$start$([ "$start" = "$prev" ] || echo "-$prev")"
  echo "$out"
}

# hex cpumask of CPUs "0 1 16 17" -> "30003"; 32-bit words comma-separated, as /proc and
# /sys print masks ("1,00000003" for CPUs 0,1,32)
mask() {
  local -a words=()
  local c w n s i
  for c in "$@"; do
    w=$((c / 32))
    words[w]=$((${words[w]:-0} | (1 << (c % 32))))
  done
  n=0
  for i in "${!words[@]}"; do ((i + 1 > n)) && n=$((i + 1)); done
  s=$(printf '%x' "${words[n - 1]:-0}")
  for ((i = n - 2; i >= 0; i--)); do s+=$(printf ',%08x' "${words[i]:-0}"); done
  echo "$s"
}

# write FILE VALUE [WHAT]: show the change, and make it with --apply
write() {
  local file=$1 value=$2 current
  if [ ! -e "$file" ]; then
    skip "$file does not exist"
    return 0
  fi
  # Multi-value files (tcp_rmem) print tabs: compare with single spaces.
  current=$(tr -s ' \t\n' '   ' <"$file" 2>/dev/null | sed 's/ *$//') || current='?'
  if [ "$current" = "$value" ]; then
    say "ok:   $file = $value"
    return 0
  fi
  if ((apply)); then
    if printf '%s\n' "$value" 2>/dev/null >"$file"; then
      say "set:  $file = $value (was $current)"
    else
      say "FAIL: $file = $value (stays $current)"
      failures=$((failures + 1))
    fi
  else
    say "would set: $file = $value (now $current)"
  fi
}

# at_least FILE MIN: like write, but only ever raises a number (a bigger setting stays)
at_least() {
  local file=$1 min=$2 current
  if [ -r "$file" ] && current=$(<"$file") && [[ $current =~ ^[0-9]+$ ]] && ((current >= min)); then
    say "ok:   $file = $current (>= $min)"
  else
    write "$file" "$min"
  fi
}

# tcp_buffers FILE MAX: raise the third (maximum) field of tcp_rmem/tcp_wmem to MAX
tcp_buffers() {
  local file=$1 max=$2 lo def hi
  if [ ! -r "$file" ]; then
    skip "$file does not exist"
    return 0
  fi
  read -r lo def hi <"$file"
  if ((hi >= max)); then
    say "ok:   $file = $lo $def $hi (max >= $max)"
  else
    write "$file" "$lo $def $max"
  fi
}

# a hex cpumask on stdin without commas, leading zeros or capitals
norm_mask() { tr -d ',\n' | sed 's/^0*//' | tr 'A-F' 'a-f'; }

# write_mask FILE MASK: write for hex cpumasks, which the kernel prints zero-padded
write_mask() {
  local file=$1 value=$2
  if [ -r "$file" ] && [ "$(norm_mask <"$file")" = "$(printf '%s' "$value" | norm_mask)" ]; then
    say "ok:   $file = $(<"$file")"
  else
    write "$file" "$value"
  fi
}

# --- the CPU sets ---------------------------------------------------------------------------
online_file=$root/sys/devices/system/cpu/online
if [ -r "$online_file" ]; then
  online=$(<"$online_file")
else
  online="0-$(($(getconf _NPROCESSORS_ONLN) - 1))"
fi
kernel_isolated=
if [ -r "$root/sys/devices/system/cpu/isolated" ]; then
  kernel_isolated=$(<"$root/sys/devices/system/cpu/isolated")
fi
if [ -z "$isolated" ]; then
  isolated=$kernel_isolated
  [ -n "$isolated" ] || {
    echo "tune-host.sh: the kernel isolates no CPUs; give --isolated LIST (see docs/host-tuning.md)" >&2
    exit 2
  }
fi
mapfile -t iso_cpus < <(expand "$isolated")
mapfile -t online_cpus < <(expand "$online")
if [ -z "$housekeeping" ]; then
  mapfile -t hk_cpus < <(printf '%s\n' "${online_cpus[@]}" | grep -vxF -f <(printf '%s\n' "${iso_cpus[@]}") || true)
else
  mapfile -t hk_cpus < <(expand "$housekeeping")
fi
((${#hk_cpus[@]} > 0)) || { echo "tune-host.sh: no housekeeping CPUs left" >&2; exit 2; }
for c in "${iso_cpus[@]}"; do
  printf '%s\n' "${online_cpus[@]}" | grep -qxF "$c" || { echo "tune-host.sh: CPU $c is not online ($online)" >&2; exit 2; }
  if printf '%s\n' "${hk_cpus[@]}" | grep -qxF "$c"; then
    echo "tune-host.sh: CPU $c is both isolated and housekeeping" >&2
    exit 2
  fi
done
iso_list=$(compress "${iso_cpus[@]}")
hk_list=$(compress "${hk_cpus[@]}")
hk_mask=$(mask "${hk_cpus[@]}")

if ((apply)); then
  [ -n "$root" ] || [ "$(id -u)" -eq 0 ] || { echo "tune-host.sh: --apply needs root" >&2; exit 1; }
  say "== applying: isolated $iso_list, housekeeping $hk_list (mask $hk_mask)"
else
  say "== dry run (nothing changes; --apply to do it): isolated $iso_list, housekeeping $hk_list (mask $hk_mask)"
fi
if [ "$kernel_isolated" != "$iso_list" ]; then
  say "note: the kernel isolates '${kernel_isolated:-nothing}', not $iso_list: set isolcpus=/nohz_full=/rcu_nocbs= at boot (docs/host-tuning.md §2)"
fi

# --- CPU frequency governor -----------------------------------------------------------------
say "== CPU frequency governor"
found=0
for gov in "$root"/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor; do
  [ -e "$gov" ] || continue
  found=1
  avail=$(dirname "$gov")/scaling_available_governors
  if [ -r "$avail" ] && ! grep -qw performance "$avail"; then
    skip "$gov: no 'performance' governor (available: $(<"$avail"))"
    continue
  fi
  write "$gov" performance
  epp=$(dirname "$gov")/energy_performance_preference
  if [ -e "$epp" ]; then write "$epp" performance; fi
done
((found)) || skip "no cpufreq on this machine (a VM or container, or the BIOS controls frequency)"

# --- transparent huge pages -----------------------------------------------------------------
say "== transparent huge pages"
thp=$root/sys/kernel/mm/transparent_hugepage
if [ -d "$thp" ]; then
  # These files print every choice with the current one in brackets: compare that one.
  for kv in enabled=madvise defrag=never; do
    f=$thp/${kv%%=*} v=${kv#*=}
    if [ -e "$f" ] && grep -qE "\[$v\]|^$v\$" "$f"; then
      say "ok:   $f = $v"
    elif [ -e "$f" ] && ((apply)); then
      if printf '%s\n' "$v" 2>/dev/null >"$f"; then say "set:  $f = $v"; else
        say "FAIL: $f = $v"
        failures=$((failures + 1))
      fi
    elif [ -e "$f" ]; then
      say "would set: $f = $v (now $(<"$f"))"
    else
      skip "$f does not exist"
    fi
  done
  write "$thp/khugepaged/defrag" 0
else
  skip "no transparent huge pages on this kernel"
fi

# --- irqbalance -----------------------------------------------------------------------------
say "== irqbalance"
if [ -n "$root" ]; then
  skip "irqbalance under TUNE_HOST_ROOT"
elif command -v systemctl >/dev/null && systemctl list-unit-files irqbalance.service 2>/dev/null | grep -q irqbalance; then
  if systemctl is-active --quiet irqbalance; then
    if ((apply)); then
      if systemctl stop irqbalance; then
        say "set:  irqbalance stopped (it stays enabled at boot: systemctl disable irqbalance)"
      else
        say "FAIL: systemctl stop irqbalance"
        failures=$((failures + 1))
      fi
    else
      say "would stop irqbalance (systemctl stop irqbalance)"
    fi
  else
    say "ok:   irqbalance is not running"
  fi
elif pgrep -x irqbalance >/dev/null 2>&1; then
  say "irqbalance runs outside systemd: stop it by hand, or it moves IRQs back"
else
  skip "no irqbalance on this machine"
fi

# --- interrupts and workqueues --------------------------------------------------------------
say "== IRQ affinity -> CPUs $hk_list"
write_mask "$root/proc/irq/default_smp_affinity" "$hk_mask"
moved=0 fixed=0 unmovable=0
for f in "$root"/proc/irq/[0-9]*/smp_affinity_list; do
  [ -e "$f" ] || continue
  current=$(<"$f")
  if [ "$current" = "$hk_list" ]; then
    fixed=$((fixed + 1))
    continue
  fi
  if ((apply)); then
    # Per-CPU and kernel-managed IRQs refuse (EIO/EINVAL): expected, counted, not fatal.
    if printf '%s\n' "$hk_list" 2>/dev/null >"$f"; then moved=$((moved + 1)); else unmovable=$((unmovable + 1)); fi
  else
    say "would set: $f = $hk_list (now $current)"
    moved=$((moved + 1))
  fi
done
if ((moved + fixed + unmovable == 0)); then
  skip "no /proc/irq/*/smp_affinity_list readable here"
elif ((apply)); then
  say "IRQs: $moved moved, $fixed already there, $unmovable refused (per-CPU or kernel-managed)"
else
  say "IRQs: $moved to move, $fixed already there"
fi
write_mask "$root/sys/devices/virtual/workqueue/cpumask" "$hk_mask"

# --- socket buffers -------------------------------------------------------------------------
say "== socket buffers"
# Only ever raised: a host already set higher keeps its values.
at_least "$root/proc/sys/net/core/rmem_max" "$rmem_max"
at_least "$root/proc/sys/net/core/wmem_max" "$wmem_max"
at_least "$root/proc/sys/net/core/rmem_default" $((8 << 20))
at_least "$root/proc/sys/net/core/wmem_default" $((8 << 20))
tcp_buffers "$root/proc/sys/net/ipv4/tcp_rmem" "$rmem_max"
tcp_buffers "$root/proc/sys/net/ipv4/tcp_wmem" "$wmem_max"

if ((failures)); then
  say "== done, $failures step(s) failed (see FAIL above)"
  exit 1
fi
say "== done"
