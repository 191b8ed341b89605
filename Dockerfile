# The Queen broker image. The image runs no PostgreSQL of its own: point it at a server with
# --database-url, DATABASE_URL or PG_HOST (the Helm chart does).

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin queen

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home queen \
    && mkdir -p /var/lib/queen && chown 10001 /var/lib/queen
COPY --from=build /src/target/release/queen /usr/local/bin/queen
COPY config/queen.toml /etc/queen/queen.toml
# The relative directories of the settings (buffer.dir's push journal) land here, where the
# broker's user may write.
WORKDIR /var/lib/queen
USER 10001
EXPOSE 6632
ENTRYPOINT ["/usr/local/bin/queen"]
CMD ["--config", "/etc/queen/queen.toml"]
