#!/usr/bin/env bash
# Test hosts for ferroccl: network namespaces joined by a bridge.
#
#   scripts/netns.sh up N     create hosts ferro0..ferro{N-1} (removes earlier ones first)
#   scripts/netns.sh down     remove every host and the switch (idempotent)
#   scripts/netns.sh check    exit 0 if namespaces can be created here, else say why and exit 1
#   scripts/netns.sh list     print the hosts that exist and their addresses
#
# Layout: host i is namespace `ferro<i>` with interface `eth0` at 10.231.0.<i+1>/24 and `lo` up.
# Its veth peer `port<i>` sits in namespace `ferrosw`, enslaved to bridge `br0`. Nothing is
# created in the namespace the script runs in.
#
# Environment (for `up`):
#   RATE=1gbit     limit every host's link with a tbf qdisc, both directions (default: none)
#   BURST=512kb    tbf bucket size when RATE is set
#   TBF_LATENCY=50ms  tbf queueing limit when RATE is set
#   SHAPER=tbf     tbf (a token bucket of BURST) or htb (one class at RATE, its burst and
#                  cburst BURST when set, else htb's default of about one timer tick at RATE)
#   MTU=1500       link MTU
#   QUICKACK=1     hosts acknowledge every TCP segment at once (the route's `quickack` flag)
#                  instead of delaying ACKs (default: the kernel's delayed ACKs)
#
# Needs root and iproute2 (`ip`, and `tc` when RATE is set).

set -Eeuo pipefail

readonly HOST_PREFIX=ferro
readonly SWITCH_NS=ferrosw
readonly BRIDGE=br0
readonly SUBNET=10.231.0
readonly MAX_HOSTS=250

die() {
    echo "netns.sh: $*" >&2
    exit 1
}

usage() {
    sed -n '2,19s/^# \{0,1\}//p' "$0"
}

# Names of the host namespaces that exist now, one per line.
existing_hosts() {
    ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${HOST_PREFIX}[0-9]+\$" || true
}

ns_exists() {
    [ -e "/var/run/netns/$1" ] || [ -e "/run/netns/$1" ]
}

cmd_check() {
    if [ "$(id -u)" -ne 0 ]; then
        echo "netns.sh check: not root (uid $(id -u)); creating network namespaces needs root" >&2
        return 1
    fi
    if ! command -v ip >/dev/null 2>&1; then
        echo "netns.sh check: 'ip' (iproute2) not found in PATH" >&2
        return 1
    fi
    local probe="${HOST_PREFIX}check$$"
    local err
    if ! err=$(ip netns add "$probe" 2>&1); then
        echo "netns.sh check: 'ip netns add' failed: $err" >&2
        return 1
    fi
    local status=0
    if ! err=$(ip -n "$probe" link add probea type veth peer name probeb 2>&1); then
        echo "netns.sh check: cannot create a veth pair inside a namespace: $err" >&2
        status=1
    elif ! err=$(ip -n "$probe" link add probebr type bridge 2>&1); then
        echo "netns.sh check: cannot create a bridge inside a namespace: $err" >&2
        status=1
    elif ! err=$(ip -n "$probe" link set lo up 2>&1); then
        echo "netns.sh check: cannot bring up lo inside a namespace: $err" >&2
        status=1
    fi
    ip netns del "$probe" 2>/dev/null || true
    if [ "$status" -eq 0 ]; then
        echo "netns.sh check: ok (network namespaces, veth and bridge available)"
    fi
    return "$status"
}

cmd_down() {
    local ns
    for ns in $(existing_hosts); do
        ip netns del "$ns" 2>/dev/null || true
    done
    if ns_exists "$SWITCH_NS"; then
        ip netns del "$SWITCH_NS" 2>/dev/null || true
    fi
}

# Adds a qdisc limiting egress of DEV in namespace NS to $RATE (tbf, or htb with SHAPER=htb).
limit_rate() {
    local ns=$1 dev=$2
    if [ "${SHAPER:-tbf}" = htb ]; then
        local burst=()
        [ -z "${BURST:-}" ] || burst=(burst "$BURST" cburst "$BURST")
        tc -n "$ns" qdisc replace dev "$dev" root handle 1: htb default 1 \
            && tc -n "$ns" class replace dev "$dev" parent 1: classid 1:1 htb rate "$RATE" quantum 60000 "${burst[@]}" \
            || { echo "netns.sh: tc htb rate=$RATE on $dev in namespace $ns failed" >&2; return 1; }
        return 0
    fi
    tc -n "$ns" qdisc replace dev "$dev" root tbf rate "$RATE" \
        burst "${BURST:-512kb}" latency "${TBF_LATENCY:-50ms}" \
        || { echo "netns.sh: tc tbf rate=$RATE on $dev in namespace $ns failed" >&2; return 1; }
}

cmd_up() {
    local n=${1:-}
    [[ "$n" =~ ^[0-9]+$ ]] || die "up: expected a host count, got '${n}'"
    [ "$n" -ge 1 ] && [ "$n" -le "$MAX_HOSTS" ] || die "up: host count $n out of range 1..$MAX_HOSTS"
    local mtu=${MTU:-1500}
    [[ "$mtu" =~ ^[0-9]+$ ]] || die "up: MTU must be a number, got '$mtu'"
    if [ -n "${RATE:-}" ]; then
        command -v tc >/dev/null 2>&1 || die "up: RATE=$RATE needs 'tc' (iproute2)"
    fi

    cmd_down
    # On any failure below, leave nothing half-built behind.
    trap 'cmd_down' ERR

    ip netns add "$SWITCH_NS"
    ip -n "$SWITCH_NS" link set lo up
    ip -n "$SWITCH_NS" link add "$BRIDGE" type bridge
    # No spanning tree delay: ports forward as soon as they are up.
    ip -n "$SWITCH_NS" link set "$BRIDGE" type bridge forward_delay 0 stp_state 0
    ip -n "$SWITCH_NS" link set "$BRIDGE" up

    local i ns port
    for ((i = 0; i < n; i++)); do
        ns="${HOST_PREFIX}${i}"
        port="port${i}"
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        # Create the pair inside the switch namespace with its other end directly in the host.
        ip -n "$SWITCH_NS" link add "$port" mtu "$mtu" type veth peer name eth0 netns "$ns" mtu "$mtu"
        ip -n "$SWITCH_NS" link set "$port" master "$BRIDGE"
        ip -n "$SWITCH_NS" link set "$port" up
        ip -n "$ns" addr add "${SUBNET}.$((i + 1))/24" dev eth0
        ip -n "$ns" link set eth0 up
        if [ "${QUICKACK:-0}" = 1 ]; then
            ip -n "$ns" route replace "${SUBNET}.0/24" dev eth0 proto kernel scope link \
                src "${SUBNET}.$((i + 1))" quickack 1
        fi
        if [ -n "${RATE:-}" ]; then
            limit_rate "$ns" eth0
            limit_rate "$SWITCH_NS" "$port"
        fi
    done
    trap - ERR
    echo "netns.sh: $n hosts up: ${HOST_PREFIX}0..${HOST_PREFIX}$((n - 1)) at ${SUBNET}.1..${SUBNET}.$n${RATE:+, rate $RATE}${QUICKACK:+, quickack $QUICKACK}"
}

cmd_list() {
    local ns
    for ns in $(existing_hosts); do
        echo "$ns $(ip -n "$ns" -4 -o addr show dev eth0 2>/dev/null | awk '{print $4}')"
    done
}

main() {
    local cmd=${1:-}
    case "$cmd" in
        up) shift; cmd_up "$@" ;;
        down) cmd_down ;;
        check) cmd_check ;;
        list) cmd_list ;;
        -h | --help | help) usage ;;
        *)
            usage >&2
            exit 2
            ;;
    esac
}

main "$@"
