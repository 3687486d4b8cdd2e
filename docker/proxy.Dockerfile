# syntax=docker/dockerfile:1
# The sidecar proxy's image. Build from the repository root:
#   docker build -f docker/proxy.Dockerfile -t ghcr.io/kinference/proxy:0.1.0 .
# It runs as UID 2102 (the chart's `proxy.uid`): proxy-init exempts that UID's traffic from
# redirection, so the proxy's own connections to model servers are not looped back to itself.

ARG RUST_VERSION=1.92
FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --locked --release -p kinference-proxy --bin kinference-proxy \
    && install -D target/release/kinference-proxy /out/kinference-proxy

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/kinference-proxy /usr/local/bin/kinference-proxy
USER 2102:2102
# 4140: outbound (loopback), 4191: admin (loopback by default), 4192: read-only metrics.
EXPOSE 4140 4191 4192
ENTRYPOINT ["/usr/local/bin/kinference-proxy"]
