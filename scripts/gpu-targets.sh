#!/usr/bin/env bash
# Reads the output of scripts/gpu-check.sh (a file, or standard input) and prints the CUDA
# speed targets against the figures of that one run, so that every ratio compares numbers
# measured on the same GPU in the same run:
#
#   kernels   f32 and bf16 `dst = a + b` at >= 90 % of the device-to-device copy (step 1)
#   p2p       2 ranks on one GPU, 256 MiB allreduce straight on the device (step 8b, direct):
#             the schedule's memory traffic at >= 60 % of step 1's copy rate
#   8 B       allreduce on device buffers, 2 ranks on one GPU: <= 20 us (steps 8b, 5, 8i, 8k)
#   staged    2 processes over shm, 64 MiB: device busbw >= 70 % of host busbw (step 6a)
#
# The ring of 2 ranks moves 9 x S bytes of device memory for an S-byte allreduce (each rank:
# its half copied into the peer's slot, read and written, 1 x S; the reduction reads the slot
# and the input and writes the output, 1.5 x S; the reduced half copied over and out, 2 x S).
# Straight between the ranks' buffers (ranks as threads of one process, the default where
# all_reduce_perf prints "# Calls between the ranks' buffers"), 4 x S: each rank reads
# its half of both inputs and writes it into both outputs. Part 8i gives both paths' figures,
# part 8k that path with calls ordered on a stream (-B 2) beside blocking ones, part 8l ranks
# that are processes with their buffers in windows (-R 2, 4 x S; blocking, and on a stream
# with -B 2) beside the ring (-R 0), part 8n unregistered buffers through scratch windows
# (8 x S: each rank copies half its input in, reduces its half, copies the other half out)
# beside the ring.
# A target whose step gave no figure (not run, or stopped early) is reported as not measured.
# Exits 0 whatever the figures: the targets are benchmarks, not part of gpu-check's verdict.
#
#     scripts/gpu-targets.sh gpu-check.log
set -euo pipefail
awk '
function num(s) { return s + 0 }
function pct(a, b) { return sprintf("%.0f %%", 100 * a / b) }
function verdict(ok) { return ok ? "met" : "NOT met" }
function bytes(n) {
    if (n >= 1048576) return sprintf("%g MiB", n / 1048576)
    if (n >= 1024) return sprintf("%g KiB", n / 1024)
    return n " B"
}
# Tools run under ferrorun tag every line with the rank: rank 0 counts, its tag taken off.
/^\[[1-9][0-9]*\] / { next }
{ sub(/^\[0\] /, "") }
# The part a table belongs to: the last header line that is not a step time ("-- tool: 5 s").
/^== [0-9]+\./ { part = $2; sub(/\.$/, "", part); next }
/^-- / {
    if ($0 ~ /^-- [^ ]+: [0-9]+ s$/) next
    part = ""
    if ($0 ~ /^-- 8b\. threads, FERRO_DEVICE_DIRECT=1/) part = "8b-direct"
    else if ($0 ~ /^-- 8i: FERRO_DEVICE_PEER=0/) part = "8i-ring"
    else if ($0 ~ /^-- 8i: FERRO_DEVICE_PEER=1/) part = "8i-peer"
    else if ($0 ~ /^-- 8k: -B 1,/) part = "8k-blocking"
    else if ($0 ~ /^-- 8k: -B 2,/) part = "8k-stream"
    else if ($0 ~ /^-- 8l: -R 0[ ,]/) part = "8l-ring"
    else if ($0 ~ /^-- 8l: -R 2 -B 2,/) part = "8l-windows-stream"
    else if ($0 ~ /^-- 8l: -R 2[ ,]/) part = "8l-windows"
    else if ($0 ~ /^-- 8n: scratch 0 /) part = "8n-ring"
    else if ($0 ~ /^-- 8n: scratch [0-9]+[KMG]? -B 2,/) part = "8n-scratch-stream"
    else if ($0 ~ /^-- 8n: scratch [0-9]+[KMG]? -B 1,/) part = "8n-scratch"
    else if ($0 ~ /^-- 8j: FERRO_DEVICE_PEER=0/) part = "8j-ring"
    else if ($0 ~ /^-- 8j: FERRO_DEVICE_PEER=1/) part = "8j-peer"
    else if ($0 ~ /^-- 8b\. threads, FERRO_DEVICE_DIRECT=0/) part = "8b-staged"
    else if (match($0, /^-- 6a round [0-9]+, -B [01]/)) {
        split(substr($0, 4, RLENGTH - 3), w, /[ ,]+/)
        part = "6a-" w[3] "-" w[5]
        rounds[w[3]] = 1
    }
    next
}
/device-to-device copy [0-9.]+ GB\/s/ {
    for (i = 1; i < NF; i++) if ($i == "copy" && $(i + 1) ~ /^[0-9.]+$/) copy = num($(i + 1))
    copy_line = $0
    next
}
/dst = a \+ b .* % of copy/ { kern[++nkern] = $0; next }
/^# Calls between the ranks. buffers/ { if (part != "") peer[part] += num($NF); next }
# A perf tool row: size count type redop root, then time algbw busbw #wrong twice.
NF >= 13 && $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ && part != "" {
    key = part SUBSEP num($1)
    oop_t[key] = num($6); oop_bw[key] = num($8)
    ip_t[key] = num($10); ip_bw[key] = num($12)
    if (num($1) > largest[part]) largest[part] = num($1)
    next
}
# One line for part `part8` at its largest size: both times, `k` x S of traffic in the faster
# against the copy rate, and with `target` the 60 % verdict where the size is 256 MiB.
function both(part8, label, k, target,    s, key, t, traffic, line) {
    s = largest[part8]
    key = part8 SUBSEP s
    if (s == 0 || !(key in oop_t)) return
    t = oop_t[key] < ip_t[key] || ip_t[key] == 0 ? oop_t[key] : ip_t[key]
    traffic = k * s / (t * 1e3)
    line = sprintf("-- %s, %s: %.1f / %.1f us out of / in place; %d x S of traffic in the faster is %.0f GB/s", label, bytes(s), oop_t[key], ip_t[key], k, traffic)
    if (copy > 0 && target && s == 268435456) line = line sprintf(", %s of the copy rate (target >= 60 %%): %s", pct(traffic, copy), verdict(100 * traffic / copy >= 60))
    else if (copy > 0) line = line sprintf(", %s of the copy rate", pct(traffic, copy))
    print line
}
END {
    print "== targets, from the figures of this run (benchmarks: not part of the verdict above)"
    if (copy > 0) print "-- copy rate: " copy " GB/s (step 1)"
    else print "-- copy rate: not measured in this run (no figure from step 1)"
    if (nkern == 0) print "-- kernels: not measured in this run (no figure from step 1)"
    for (i = 1; i <= nkern; i++) {
        line = kern[i]
        sub(/^# bandwidth /, "", line)
        print "-- kernels: " line
    }

    s = largest["8b-direct"]
    key = "8b-direct" SUBSEP s
    if (s == 0 || !(key in oop_t)) {
        print "-- p2p allreduce, 2 ranks on one GPU: not measured in this run (no figure from step 8b)"
    } else {
        t = oop_t[key] < ip_t[key] || ip_t[key] == 0 ? oop_t[key] : ip_t[key]
        k = peer["8b-direct"] > 0 ? 4 : 9
        path = k == 4 ? "between the buffers of the ranks" : "ring"
        traffic = k * s / (t * 1e3)
        line = sprintf("-- p2p allreduce, 2 ranks on one GPU, %s (8b, direct, %s): %.1f / %.1f us out of / in place; %d x S of traffic in the faster, %.1f us, is %.0f GB/s", bytes(s), path, oop_t[key], ip_t[key], k, t, traffic)
        if (s != 268435456) line = line " (the target is set at 256 MiB)"
        if (copy > 0) line = line sprintf(", %s of the copy rate (target >= 60 %%): %s", pct(traffic, copy), verdict(100 * traffic / copy >= 60))
        else line = line " (no copy rate to compare with)"
        print line
    }

    # Part 8i: the two paths side by side at the largest size, alternated in one run; part 8k:
    # between the buffers, calls on a stream against blocking calls (the 60 % target at 256 MiB).
    both("8i-ring", "8i, ring (FERRO_DEVICE_PEER=0)", 9, 0)
    both("8i-peer", "8i, between the buffers of the ranks", 4, 0)
    both("8k-blocking", "8k, between the buffers of the ranks, blocking calls (-B 1)", 4, 1)
    both("8k-stream", "8k, between the buffers of the ranks, calls on a stream (-B 2)", 4, 1)
    # Part 8l: 2 processes, buffers in windows against the ring.
    both("8l-ring", "8l, 2 processes, ring (-R 0)", 9, 0)
    both("8l-windows", "8l, 2 processes, between the buffers through windows (-R 2)", 4, 1)
    both("8l-windows-stream", "8l, 2 processes, through windows, calls on a stream (-R 2 -B 2)", 4, 1)
    # Part 8n: 2 processes, buffers in no window, through scratch windows (8 x S: each rank
    # copies half its input in, reduces, copies the other half out) against the ring.
    both("8n-ring", "8n, 2 processes, ring (no scratch)", 9, 0)
    both("8n-scratch", "8n, 2 processes, through scratch windows (-B 1)", 8, 1)
    both("8n-scratch-stream", "8n, 2 processes, through scratch windows, calls on a stream (-B 2)", 8, 1)

    # Part 8j, two GPUs (no target: the targets are for one GPU): both paths at the largest size.
    for (p = 0; p <= 1; p++) {
        part8 = p ? "8j-peer" : "8j-ring"
        s = largest[part8]
        key = part8 SUBSEP s
        if (s == 0 || !(key in oop_t)) continue
        printf "-- 8j, two GPUs, %s, %s: %.1f / %.1f us out of / in place, busbw %.1f / %.1f GB/s (no target)\n", p ? "between the buffers of the ranks" : "ring (FERRO_DEVICE_PEER=0)", bytes(s), oop_t[key], ip_t[key], oop_bw[key], ip_bw[key]
    }

    split("8b-direct 8b-staged 5 8i-peer 8i-ring 8k-blocking 8k-stream 8l-windows 8l-windows-stream 8l-ring 8n-scratch 8n-scratch-stream 8n-ring", eight, " ")
    names["8b-direct"] = "8b, p2p, direct"; names["8b-staged"] = "8b, p2p, staged"; names["5"] = "5, shm, staged"
    names["8i-peer"] = "8i, between the buffers of the ranks"; names["8i-ring"] = "8i, lanes, FERRO_DEVICE_PEER=0"
    names["8k-blocking"] = "8k, between the buffers, blocking calls"; names["8k-stream"] = "8k, between the buffers, calls on a stream"
    names["8l-windows"] = "8l, 2 processes, windows"; names["8l-ring"] = "8l, 2 processes, -R 0"
    names["8l-windows-stream"] = "8l, 2 processes, windows, calls on a stream"
    names["8n-scratch"] = "8n, 2 processes, scratch windows"; names["8n-ring"] = "8n, 2 processes, no scratch"
    names["8n-scratch-stream"] = "8n, 2 processes, scratch windows, calls on a stream"
    seen8 = 0
    for (i = 1; i <= 13; i++) {
        key = eight[i] SUBSEP 8
        if (!(key in oop_t)) continue
        seen8 = 1
        printf "-- 8 B allreduce on device buffers, 2 ranks on one GPU (%s): %.1f / %.1f us out of / in place (target <= 20 us): %s\n", names[eight[i]], oop_t[key], ip_t[key], verdict(oop_t[key] <= 20)
    }
    if (!seen8) print "-- 8 B allreduce on device buffers: not measured in this run (no figure from steps 5 and 8b)"

    seen6 = 0
    for (r in rounds) {
        h = "6a-" r "-0" SUBSEP 67108864
        d = "6a-" r "-1" SUBSEP 67108864
        if (!(h in oop_bw) || !(d in oop_bw) || oop_bw[h] == 0 || ip_bw[h] == 0) continue
        seen6 = 1
        printf "-- shm staged, 2 processes, 64 MiB (6a round %s): device %.2f / %.2f GB/s busbw against host %.2f / %.2f out of / in place: %s / %s of host (target >= 70 %%): %s\n", r, oop_bw[d], ip_bw[d], oop_bw[h], ip_bw[h], pct(oop_bw[d], oop_bw[h]), pct(ip_bw[d], ip_bw[h]), verdict(oop_bw[d] >= 0.7 * oop_bw[h] && ip_bw[d] >= 0.7 * ip_bw[h])
    }
    if (!seen6) print "-- shm staged against host buffers at 64 MiB: not measured in this run (no figure from step 6a)"
}
' "${1:--}"
