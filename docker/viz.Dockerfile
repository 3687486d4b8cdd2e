# syntax=docker/dockerfile:1
# The viz extension's image (`charts/kinference-viz`): the metrics API and dashboard over
# Prometheus, the `kinference-viz` binary of viz/ (its `serve` subcommand is what the chart runs).
# Build from the repository root:
#   docker build -f docker/viz.Dockerfile -t ghcr.io/kinference/viz:0.1.0 .
# The runtime image is distroless (glibc, no shell) and runs as the distroless `nonroot` user,
# which the chart's securityContext (runAsUser 65532, read-only root filesystem) expects.

ARG RUST_VERSION=1.92
FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --locked --release -p kinference-viz --bin kinference-viz \
    && install -D target/release/kinference-viz /out/kinference-viz

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/kinference-viz /usr/local/bin/kinference-viz
USER 65532:65532
EXPOSE 8084
ENTRYPOINT ["/usr/local/bin/kinference-viz"]
