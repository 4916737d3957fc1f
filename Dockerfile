# syntax=docker/dockerfile:1
# The lockstep container image (see docs/operations.md, "Container image"):
#
#   docker build -t REGISTRY/lockstep:TAG .
#
# Built by cargo in Debian's Rust image; run from distroless cc: glibc, CA
# certificates (for https:// upstreams and PostgreSQL over TLS) and the
# non-root user 65532, with no shell or package manager to attack.

FROM rust:bookworm AS build
WORKDIR /src
# Only what the binary is built from (migrations are embedded at compile time).
COPY Cargo.toml Cargo.lock ./
# Build settings (how the bundled SQLite is compiled).
COPY .cargo .cargo
COPY src src
COPY migrations migrations
# The workspace's other member (the protocol model): cargo reads its
# manifest, though only the lockstep binary is built.
COPY model model
# BuildKit caches keep the crate downloads and the target directory between
# builds; the binary is copied out of the cache in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin lockstep \
    && install -D -m 0755 target/release/lockstep /out/lockstep \
    && install -d -o 65532 -g 65532 /out/var/lib/lockstep

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/lockstep /lockstep
# A writable home for the default SQLite file (sqlite://lockstep.db is
# relative to the working directory); in Kubernetes the chart mounts a volume.
COPY --from=build --chown=65532:65532 /out/var/lib/lockstep /var/lib/lockstep
# The documented defaults, so `docker run` works without a config of its own;
# the chart passes --config /etc/lockstep/config/lockstep.toml instead.
COPY config/lockstep.toml /etc/lockstep/lockstep.toml
WORKDIR /var/lib/lockstep
USER 65532:65532
# 8080: the proxy listener; 9090: the admin listener (health, metrics, locks).
EXPOSE 8080 9090
ENTRYPOINT ["/lockstep"]
CMD ["serve", "--config", "/etc/lockstep/lockstep.toml"]
