# syntax=docker/dockerfile:1
# The policy controller's image. Build from the repository root:
#   docker build -f docker/controller.Dockerfile -t ghcr.io/kinference/policy-controller:0.1.0 .
# The runtime image is distroless (glibc, no shell) and runs as the distroless `nonroot` user,
# which the chart's securityContext (runAsUser 65532, read-only root filesystem) expects.

ARG RUST_VERSION=1.92
FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --locked --release -p kinference-policy-controller --bin kinference-policy-controller \
    && install -D target/release/kinference-policy-controller /out/kinference-policy-controller

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/kinference-policy-controller /usr/local/bin/kinference-policy-controller
USER 65532:65532
EXPOSE 8090 9990 9443
ENTRYPOINT ["/usr/local/bin/kinference-policy-controller"]
