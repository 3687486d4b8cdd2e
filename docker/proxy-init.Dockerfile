# syntax=docker/dockerfile:1
# proxy-init: the init container that redirects a pod's outbound TCP to the proxy with iptables
# (the `kinference-proxy-init` binary of proxy/init). It needs the iptables programs, so it is
# Debian slim rather than distroless; it runs as root with NET_ADMIN and NET_RAW (set by the
# injector) only until the pod's containers start. Build from the repository root:
#   docker build -f docker/proxy-init.Dockerfile -t ghcr.io/kinference/proxy-init:0.1.0 .
# The image carries both iptables backends: KINFERENCE_IPTABLES=iptables-legacy (or iptables-nft)
# picks the node's.

ARG RUST_VERSION=1.92
FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --locked --release -p kinference-proxy-init --bin kinference-proxy-init \
    && install -D target/release/kinference-proxy-init /out/kinference-proxy-init

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends iptables \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/kinference-proxy-init /usr/local/bin/kinference-proxy-init
ENTRYPOINT ["/usr/local/bin/kinference-proxy-init"]
