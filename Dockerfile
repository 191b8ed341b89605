# The Queen broker image. The image runs no PostgreSQL of its own: point it at a server with
# --database-url, DATABASE_URL or PG_HOST (the Helm chart does).

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin queen

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home queen
COPY --from=build /src/target/release/queen /usr/local/bin/queen
COPY config/queen.toml /etc/queen/queen.toml
USER 10001
EXPOSE 6632
ENTRYPOINT ["/usr/local/bin/queen"]
CMD ["--config", "/etc/queen/queen.toml"]
