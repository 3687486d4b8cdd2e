# syntax=docker/dockerfile:1
# proxy-init: the init container that redirects a pod's outbound model traffic to the proxy with
# iptables. It needs iptables and a shell, so it is Debian slim rather than distroless, and it runs
# as root with NET_ADMIN and NET_RAW (set by the injector), only until the pod's containers start.
#   docker build -f docker/proxy-init.Dockerfile -t ghcr.io/kinference/proxy-init:0.1.0 docker/

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends iptables \
    && rm -rf /var/lib/apt/lists/*
COPY proxy-init/kinference-proxy-init.sh /usr/local/bin/kinference-proxy-init
ENTRYPOINT ["/usr/local/bin/kinference-proxy-init"]
