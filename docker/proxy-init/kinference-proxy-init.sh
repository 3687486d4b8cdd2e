#!/bin/sh
# Redirects the pod's outbound TCP connections to the model servers' ports to the Kinference
# proxy, except the proxy's own (its UID), so that applications keep calling their model Service
# unchanged. Safe to run twice: the chain is flushed and rebuilt.
#
#   KINFERENCE_PROXY_PORT     the proxy's outbound port (default 4140)
#   KINFERENCE_PROXY_UID      the proxy's UID, never redirected (default 2102)
#   KINFERENCE_OUTBOUND_PORTS comma-separated destination ports to redirect, e.g. "8000,80"
#   KINFERENCE_SKIP_OUTBOUND_CIDRS comma-separated destination CIDRs never redirected
#   IPTABLES                  the iptables binary (default iptables; iptables-legacy on old nodes)
set -eu

proxy_port="${KINFERENCE_PROXY_PORT:-4140}"
proxy_uid="${KINFERENCE_PROXY_UID:-2102}"
ports="${KINFERENCE_OUTBOUND_PORTS:-}"
skip_cidrs="${KINFERENCE_SKIP_OUTBOUND_CIDRS:-}"
ipt="${IPTABLES:-iptables}"
chain=KINFERENCE_OUTPUT

if [ -z "$ports" ]; then
    echo "kinference-proxy-init: KINFERENCE_OUTBOUND_PORTS is empty; nothing to redirect" >&2
    exit 0
fi

"$ipt" -t nat -N "$chain" 2>/dev/null || "$ipt" -t nat -F "$chain"
"$ipt" -t nat -A "$chain" -m owner --uid-owner "$proxy_uid" -j RETURN
"$ipt" -t nat -A "$chain" -o lo -j RETURN
for cidr in $(echo "$skip_cidrs" | tr ',' ' '); do
    "$ipt" -t nat -A "$chain" -d "$cidr" -j RETURN
done
for port in $(echo "$ports" | tr ',' ' '); do
    "$ipt" -t nat -A "$chain" -p tcp --dport "$port" -j REDIRECT --to-ports "$proxy_port"
done
"$ipt" -t nat -C OUTPUT -p tcp -j "$chain" 2>/dev/null || "$ipt" -t nat -A OUTPUT -p tcp -j "$chain"
echo "kinference-proxy-init: TCP to ports $ports redirected to $proxy_port (UID $proxy_uid exempt)" >&2
